//! Value parsers of the secrets given on the command line: refused at start when empty, short
//! or malformed (the message names the flag, never the value: clap's own message for a
//! refused value quotes it, so these build theirs).

use std::ffi::OsStr;

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;

use crate::dashboard::mail::SmtpServer;

/// The shortest admin token, webhook secret or responses secret accepted. An empty one used to
/// turn admin authentication off or let anyone sign a webhook; a short one can be guessed.
pub const MIN_SECRET_CHARS: usize = 16;
/// The shortest dev key accepted, prefix included.
pub const MIN_DEV_KEY_CHARS: usize = 20;
/// What every API key starts with, so that secret scanners recognise a leaked one.
pub const KEY_PREFIX: &str = "sk-svc-";

/// The value parser of a secret flag: `parse` takes the value or says why it is refused, and
/// the refusal names the flag alone.
#[derive(Clone, Copy)]
pub(super) struct Secret<T> {
    parse: fn(&str) -> Result<T, String>,
}

/// Parser of the admin token and the webhook and responses secrets.
pub(super) const LONG_SECRET: Secret<String> = Secret {
    parse: |value| long_secret(value).map(|()| value.to_owned()),
};
/// Parser of `--dev-key`.
pub(super) const DEV_KEY: Secret<String> = Secret {
    parse: |value| dev_key(value).map(|()| value.to_owned()),
};
/// Parser of `--smtp-url`, whose password is a secret too.
pub(super) const SMTP_URL: Secret<SmtpServer> = Secret {
    parse: SmtpServer::parse,
};

impl<T: Clone + Send + Sync + 'static> TypedValueParser for Secret<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let flag = arg.map_or_else(|| "a secret flag".to_owned(), |a| format!("'{a}'"));
        let refuse = |why: String| {
            clap::Error::raw(
                ErrorKind::ValueValidation,
                format!("invalid value for {flag}: {why}\n"),
            )
            .with_cmd(cmd)
        };
        let value = value
            .to_str()
            .ok_or_else(|| refuse("must be UTF-8 text".to_owned()))?;
        (self.parse)(value).map_err(refuse)
    }
}

fn long_secret(value: &str) -> Result<(), String> {
    if value.trim().chars().count() < MIN_SECRET_CHARS {
        return Err(format!(
            "must be at least {MIN_SECRET_CHARS} characters (an empty or short secret would let \
             anyone in); generate one with `openssl rand -hex 24`"
        ));
    }
    Ok(())
}

/// `--dev-key` must look like the keys the gateway issues.
fn dev_key(value: &str) -> Result<(), String> {
    if !value.starts_with(KEY_PREFIX)
        || value.chars().count() < MIN_DEV_KEY_CHARS
        || value.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "must start with `{KEY_PREFIX}` and be at least {MIN_DEV_KEY_CHARS} characters \
             without spaces, e.g. `{KEY_PREFIX}` followed by `openssl rand -hex 20`"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_secret_is_not_quoted_in_the_error() {
        let cmd = clap::Command::new("gateway").arg(
            clap::Arg::new("admin_token")
                .long("admin-token")
                .value_parser(LONG_SECRET),
        );
        let Err(e) = cmd.try_get_matches_from(["gateway", "--admin-token", "short-CANARY"]) else {
            panic!("a short secret was accepted");
        };
        let text = e.render().to_string();
        assert!(text.contains("--admin-token"), "{text}");
        assert!(!text.contains("CANARY"), "{text}");
    }

    #[test]
    fn empty_and_short_secrets_are_refused() {
        assert!(long_secret("").is_err());
        assert!(long_secret("                    ").is_err());
        assert!(long_secret("0123456789abcde").is_err());
        assert!(long_secret("0123456789abcdef").is_ok());
    }

    #[test]
    fn a_dev_key_must_look_like_a_key() {
        assert!(dev_key("K").is_err());
        assert!(dev_key("sk-svc-1").is_err());
        assert!(dev_key("0123456789abcdef0123456789").is_err());
        assert!(dev_key("sk-svc-0123456789 abcdef").is_err());
        assert!(dev_key("sk-svc-0123456789abcdef").is_ok());
    }
}
