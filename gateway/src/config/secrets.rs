//! Value parsers of the secrets given on the command line: refused at start when empty, short
//! or malformed (the message names the flag, never the value).

/// The shortest admin token, webhook secret or responses secret accepted. An empty one used to
/// turn admin authentication off or let anyone sign a webhook; a short one can be guessed.
pub const MIN_SECRET_CHARS: usize = 16;
/// The shortest dev key accepted, prefix included.
pub const MIN_DEV_KEY_CHARS: usize = 20;
/// What every API key starts with, so that secret scanners recognise a leaked one.
pub const KEY_PREFIX: &str = "sk-svc-";

pub(super) fn long_secret(value: &str) -> Result<String, String> {
    if value.trim().chars().count() < MIN_SECRET_CHARS {
        return Err(format!(
            "must be at least {MIN_SECRET_CHARS} characters (an empty or short secret would let \
             anyone in); generate one with `openssl rand -hex 24`"
        ));
    }
    Ok(value.to_owned())
}

/// Value parser of `--dev-key`: it must look like the keys the gateway issues.
pub(super) fn dev_key(value: &str) -> Result<String, String> {
    if !value.starts_with(KEY_PREFIX)
        || value.chars().count() < MIN_DEV_KEY_CHARS
        || value.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "must start with `{KEY_PREFIX}` and be at least {MIN_DEV_KEY_CHARS} characters \
             without spaces, e.g. `{KEY_PREFIX}` followed by `openssl rand -hex 20`"
        ));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

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
