//! The host names a server of this process answers to (`Host`), shared by the admin port and the dashboard: a
//! page that rebinds its own DNS name to the server's address (DNS rebinding) makes the browser send that name, so
//! it is refused (`421`) and reads nothing.
//!
//! The names are `localhost`, any IP address (an address cannot be rebound: a page served from it is the server
//! itself, and the kubelet and Prometheus reach a pod by its address), and the names configured (the dashboard's
//! `--public-host`, the admin port's `admin.allowed_hosts`), on any port, in any case.

use std::net::IpAddr;

use axum::http::uri::Authority;
use axum::http::{HeaderMap, Uri, header};

/// The host names a server answers to besides `localhost` and IP addresses, lowercase.
#[derive(Debug, Clone, Default)]
pub struct HostList {
    /// The configured names, lowercase, without port.
    names: Vec<String>,
}

impl HostList {
    /// A list of `localhost`, every IP address and `names` (each checked by [`host_name`]); `Err` names the first
    /// value that is not a host name.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let names = names
            .into_iter()
            .map(|name| host_name(name).ok_or_else(|| format!("{name:?} is not a host name")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { names })
    }

    /// Whether `name` (a host without its port) is one of the configured names (not `localhost`, not an address).
    pub fn is_configured(&self, name: &str) -> bool {
        self.names.iter().any(|own| own.eq_ignore_ascii_case(name))
    }

    /// Whether `name` (a host without its port) is one of the server's: `localhost`, an IP address or a
    /// configured name.
    pub fn is_own_name(&self, name: &str) -> bool {
        name.eq_ignore_ascii_case("localhost") || ip_literal(name).is_some() || self.is_configured(name)
    }

    /// Whether a `Host` value (or a request URI's authority) names the server.
    pub fn is_own_host(&self, host: &str) -> bool {
        !host.contains('@') && host.parse::<Authority>().is_ok_and(|authority| self.is_own_name(authority.host()))
    }

    /// Whether a request names the server: its `Host` does, and an absolute request URI names no other host. A
    /// request without `Host` is refused.
    pub fn admits(&self, headers: &HeaderMap, uri: &Uri) -> bool {
        headers.get(header::HOST).and_then(|value| value.to_str().ok()).is_some_and(|host| self.is_own_host(host))
            && uri.authority().is_none_or(|authority| self.is_own_host(authority.as_str()))
    }
}

/// An IP address written as a host (`127.0.0.1`, `[::1]`).
pub fn ip_literal(name: &str) -> Option<IpAddr> {
    name.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')).unwrap_or(name).parse().ok()
}

/// A configured host name (or address) without scheme, port or path, lowercased; `None` for anything else.
pub fn host_name(name: &str) -> Option<String> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '[' | ']' | ':'))
        && (ip_literal(name).is_some() || !name.contains([':', '[', ']']));
    valid.then(|| name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_the_loopback_names_any_address_and_the_configured_ones() {
        let hosts = HostList::new(["Dash.Example.com"]).unwrap_or_else(|e| panic!("{e}"));
        for host in ["localhost", "LOCALHOST:9090", "127.0.0.1:8080", "[::1]:8080", "10.1.2.3", "dash.example.com:443"]
        {
            assert!(hosts.is_own_host(host), "{host}");
        }
        for host in ["evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "a@localhost", "", "dash"] {
            assert!(!hosts.is_own_host(host), "{host}");
        }
        assert!(hosts.is_configured("DASH.example.com") && !hosts.is_configured("localhost"));
    }

    #[test]
    fn a_configured_name_is_a_name_only() {
        for bad in ["", "https://dash.example.com", "dash.example.com:443", "dash.example.com/x", "a b", "[x]"] {
            assert_eq!(host_name(bad), None, "{bad:?}");
        }
        assert_eq!(host_name("Metrics.Internal"), Some("metrics.internal".to_owned()));
        assert_eq!(host_name("[::1]"), Some("[::1]".to_owned()));
        assert!(HostList::new(["ok", "not ok"]).unwrap_err().contains("\"not ok\""));
    }
}
