//! The mail domains of public mail providers, which no organization may claim for single
//! sign-on: anyone can get an address there, so a verified address of the domain proves
//! nothing about an organization. A short list of the largest providers, kept here rather
//! than taken from a crate: the crates found (`email_provider_validator`) download their lists
//! from the web in their build scripts, which offline builds cannot, and whose contents change
//! under one version. A provider missing here is still bounded by the claim's other rule (the
//! owner's own verified address), and a claim can be released.

/// Lower-cased; a subdomain of one (`eu.gmail.com`) is refused too.
const PUBLIC: &[&str] = &[
    "126.com",
    "163.com",
    "aim.com",
    "aol.com",
    "att.net",
    "comcast.net",
    "fastmail.com",
    "fastmail.fm",
    "gmail.com",
    "gmx.com",
    "gmx.de",
    "gmx.net",
    "googlemail.com",
    "hey.com",
    "hotmail.co.uk",
    "hotmail.com",
    "hotmail.de",
    "hotmail.fr",
    "hushmail.com",
    "icloud.com",
    "inbox.com",
    "live.com",
    "mac.com",
    "mail.com",
    "mail.ru",
    "me.com",
    "msn.com",
    "naver.com",
    "outlook.com",
    "pm.me",
    "proton.me",
    "protonmail.com",
    "qq.com",
    "rocketmail.com",
    "sbcglobal.net",
    "t-online.de",
    "tuta.io",
    "tutanota.com",
    "verizon.net",
    "web.de",
    "yahoo.co.jp",
    "yahoo.co.uk",
    "yahoo.com",
    "yahoo.de",
    "yahoo.fr",
    "yandex.com",
    "yandex.ru",
    "ymail.com",
    "zoho.com",
];

/// Whether `domain` (lower-cased) is a public mail provider's, or a subdomain of one.
pub fn public_mail_domain(domain: &str) -> bool {
    PUBLIC.iter().any(|public| {
        domain == *public
            || domain
                .strip_suffix(public)
                .is_some_and(|rest| rest.ends_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_providers_and_their_subdomains_are_public_and_look_alikes_are_not() {
        assert!(public_mail_domain("gmail.com"));
        assert!(public_mail_domain("eu.gmail.com"));
        assert!(!public_mail_domain("notgmail.com"));
        assert!(!public_mail_domain("corp.example"));
    }
}
