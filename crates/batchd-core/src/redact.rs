//! Redis URLs made safe to show: the one mask every message, log line and config dump uses for a URL's password.

/// A Redis URL with its password (if any) replaced by `[redacted]`, for display; the user name stays, so an ACL
/// user can still be told apart. Userinfo without a `:` may be a bare password, so it is masked as a whole.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            let user = credentials.split_once(':').map_or("", |(user, _)| user);
            format!("{}://{user}:[redacted]@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact_url("redis://user:secret@host:6379/0"), "redis://user:[redacted]@host:6379/0");
        assert_eq!(redact_url("redis://:secret@host:6379"), "redis://:[redacted]@host:6379");
        assert_eq!(redact_url("rediss://secret@host:6380"), "rediss://:[redacted]@host:6380");
        assert_eq!(redact_url("redis://user:p@ss@host"), "redis://user:[redacted]@host", "the last @ ends it");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact_url("rediss://host:6380"), "rediss://host:6380");
        assert_eq!(redact_url("not a url @ all"), "not a url @ all");
    }
}
