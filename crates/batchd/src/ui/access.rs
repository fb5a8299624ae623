//! Who the dashboard answers. Every request must name one of the dashboard's own hosts (`Host`), so a page that
//! rebinds its own DNS name to the dashboard's address (DNS rebinding) gets nothing: its requests carry its name.
//! When authentication is configured, every request must also carry the token (bearer or basic-auth password) or
//! the user header an authenticating proxy sets, except [`PUBLIC_PATHS`]: the two assets (the same bytes for
//! everyone) and the readiness probe (which says only whether Redis answers). Actions, on top, must come from a page of one of those hosts
//! (`Origin`, checked against the same list, never against `Host` alone).
//!
//! The hosts are `localhost`, any IP address (an address cannot be rebound: a page served from it is the dashboard
//! itself), and each `--public-host` name, on any port. Refusals are short plain text that never echoes the request.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use subtle::ConstantTimeEq as _;

/// The paths answered without authentication (still only to the dashboard's hosts): the stylesheet and the
/// script, which hold nothing but the binary's own text, and `/readyz`, which says only whether Redis answers, so
/// the Kubernetes probes (liveness on `/assets/ui.css`, readiness on `/readyz`) need no token.
pub const PUBLIC_PATHS: [&str; 3] = ["/assets/ui.css", "/assets/ui.js", "/readyz"];

/// Shortest token `--auth-token-file` may hold.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Longest user name taken from the trusted header (what is logged with an action).
const MAX_USER_BYTES: usize = 200;

/// The realm a browser shows in its basic-auth prompt.
const REALM: &str = "Basic realm=\"batchd ui\", charset=\"UTF-8\"";

/// What the dashboard answers and whom: its host names and its authentication.
#[derive(Debug)]
pub struct Access {
    /// The `--public-host` names, lowercase.
    public_hosts: Vec<String>,
    /// The token of `--auth-token-file`.
    token: Option<Token>,
    /// The header of `--trusted-user-header`.
    trusted_user_header: Option<HeaderName>,
}

/// The dashboard's token; never printed.
struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Who made a request, as the guard found it: the basic-auth user name, `token` for a bearer token, the trusted
/// header's value, or `None` when no authentication is configured. Logged with every action.
#[derive(Debug, Clone)]
pub struct User(pub Option<String>);

impl Access {
    /// Checks the `batchd ui` flags that decide access and reads the token file. Refuses `--allow-actions` on an
    /// address that is not loopback without authentication, in one line that says what to add.
    pub fn from_args(
        listen: SocketAddr,
        allow_actions: bool,
        public_hosts: &[String],
        token_file: Option<&Path>,
        trusted_user_header: Option<&str>,
    ) -> anyhow::Result<Self> {
        let public_hosts = public_hosts.iter().map(|name| public_host(name)).collect::<anyhow::Result<Vec<_>>>()?;
        let token = token_file.map(read_token).transpose()?;
        let trusted_user_header = trusted_user_header
            .map(|name| {
                HeaderName::from_bytes(name.as_bytes())
                    .with_context(|| format!("--trusted-user-header: {name:?} is not a header name"))
            })
            .transpose()?;
        if allow_actions && !listen.ip().is_loopback() && token.is_none() && trusted_user_header.is_none() {
            bail!(
                "--allow-actions on {listen} (not a loopback address) needs authentication: add --auth-token-file \
                 PATH, or --trusted-user-header NAME behind a proxy that authenticates, or listen on 127.0.0.1"
            );
        }
        Ok(Self { public_hosts, token, trusted_user_header })
    }

    /// Whether requests must authenticate.
    pub fn authenticates(&self) -> bool {
        self.token.is_some() || self.trusted_user_header.is_some()
    }

    /// Whether `name` (a host without its port) is one of the dashboard's.
    fn is_own_name(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        name == "localhost" || ip_literal(&name).is_some() || self.public_hosts.contains(&name)
    }

    /// Whether a `Host` value (or a request URI's authority) names the dashboard.
    fn is_own_host(&self, host: &str) -> bool {
        !host.contains('@') && host.parse::<Authority>().is_ok_and(|authority| self.is_own_name(authority.host()))
    }

    /// Whether an action comes from a page of the dashboard: an `Origin` whose host is one of the dashboard's and
    /// either a `--public-host` (a proxy may rewrite `Host`) or exactly the `Host` the request was sent to (same
    /// name and port); without `Origin`, the browser's own `Sec-Fetch-Site: same-origin`.
    pub fn is_own_origin(&self, headers: &HeaderMap) -> bool {
        let text = |name: HeaderName| headers.get(name).and_then(|value| value.to_str().ok());
        match text(header::ORIGIN) {
            Some(origin) if origin != "null" => {
                let Some(authority) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else {
                    return false;
                };
                let Ok(parsed) = authority.parse::<Authority>() else { return false };
                if authority.contains(['@', '/']) || !self.is_own_name(parsed.host()) {
                    return false;
                }
                self.public_hosts.contains(&parsed.host().to_ascii_lowercase())
                    || text(header::HOST).is_some_and(|host| host.eq_ignore_ascii_case(authority))
            }
            _ => text(HeaderName::from_static("sec-fetch-site")) == Some("same-origin"),
        }
    }

    /// Who the request is from, when authentication is configured; `Err` with the refusal otherwise.
    fn authenticate(&self, headers: &HeaderMap) -> Result<User, Refusal> {
        if !self.authenticates() {
            return Ok(User(None));
        }
        if let (Some(token), Some(value)) = (&self.token, headers.get(header::AUTHORIZATION))
            && let Some(user) = credentials(value).and_then(|(user, secret)| {
                let equal: bool = secret.as_slice().ct_eq(token.0.as_slice()).into();
                equal.then_some(user)
            })
        {
            return Ok(User(Some(user)));
        }
        if let Some(name) = &self.trusted_user_header
            && let Some(user) = headers.get(name).and_then(|value| value.to_str().ok())
            && !user.trim().is_empty()
        {
            let user: String = user.trim().chars().take(MAX_USER_BYTES).collect();
            return Ok(User(Some(crate::cli::escape_for_terminal(&user).into_owned())));
        }
        Err(if self.token.is_some() { Refusal::Unauthenticated } else { Refusal::NoProxyUser })
    }
}

/// `(user, secret)` from an `Authorization` value: `Bearer <token>` (user `token`) or `Basic <base64 user:pass>`.
fn credentials(value: &HeaderValue) -> Option<(String, Vec<u8>)> {
    let value = value.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(("token".to_owned(), rest.trim().as_bytes().to_vec()));
    }
    if !scheme.eq_ignore_ascii_case("basic") || rest.len() > 4 * 1024 {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
    let colon = decoded.iter().position(|&byte| byte == b':')?;
    let user: String = String::from_utf8_lossy(&decoded[..colon]).chars().take(MAX_USER_BYTES).collect();
    let user = if user.is_empty() { "token".to_owned() } else { crate::cli::escape_for_terminal(&user).into_owned() };
    Some((user, decoded[colon + 1..].to_vec()))
}

/// An IP address written as a host (`127.0.0.1`, `[::1]`).
fn ip_literal(name: &str) -> Option<IpAddr> {
    name.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')).unwrap_or(name).parse().ok()
}

/// A `--public-host` value: a host name (or address) without scheme, port or path, lowercased.
fn public_host(name: &str) -> anyhow::Result<String> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '[' | ']' | ':'))
        && (ip_literal(name).is_some() || !name.contains([':', '[', ']']));
    if !valid {
        bail!("--public-host: {name:?} is not a host name (give the name only, e.g. dash.example.com)");
    }
    Ok(name.to_ascii_lowercase())
}

/// The token of `--auth-token-file`: the file's content without its trailing newline.
fn read_token(path: &Path) -> anyhow::Result<Token> {
    let content = std::fs::read(path).with_context(|| format!("--auth-token-file: cannot read {}", path.display()))?;
    let token = content.trim_ascii_end().to_vec();
    if token.len() < MIN_TOKEN_BYTES || token.iter().any(|byte| byte.is_ascii_control() || *byte == b' ') {
        bail!(
            "--auth-token-file: {} must hold one token of at least {MIN_TOKEN_BYTES} characters without spaces",
            path.display()
        );
    }
    Ok(Token(token))
}

/// Why the guard refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// `Host` is not one of the dashboard's names.
    ForeignHost,
    /// No valid token (the browser is asked for basic auth).
    Unauthenticated,
    /// Only the proxy's user header is accepted, and it is absent.
    NoProxyUser,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            Self::ForeignHost => (
                StatusCode::MISDIRECTED_REQUEST,
                "this dashboard answers only to its own host names (localhost, its IP addresses and each \
                 --public-host)\n",
            ),
            Self::Unauthenticated => (StatusCode::UNAUTHORIZED, "authentication required: the dashboard's token\n"),
            Self::NoProxyUser => {
                (StatusCode::FORBIDDEN, "refused: no user from the authenticating proxy (the trusted header)\n")
            }
        };
        let mut response = (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response();
        if self == Self::Unauthenticated {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(REALM));
        }
        response
    }
}

/// The middleware in front of every route: the host check, then authentication (but for [`PUBLIC_PATHS`]); the
/// user found is handed to the handlers as a [`User`] extension.
pub async fn guard(State(access): State<Arc<Access>>, mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host_ok =
        headers.get(header::HOST).and_then(|value| value.to_str().ok()).is_some_and(|h| access.is_own_host(h))
            && request.uri().authority().is_none_or(|authority| access.is_own_host(authority.as_str()));
    if !host_ok {
        return Refusal::ForeignHost.into_response();
    }
    if PUBLIC_PATHS.contains(&request.uri().path()) {
        request.extensions_mut().insert(User(None));
        return next.run(request).await;
    }
    match access.authenticate(headers) {
        Ok(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(public: &[&str]) -> Access {
        let public: Vec<String> = public.iter().map(|s| (*s).to_owned()).collect();
        Access::from_args("127.0.0.1:8080".parse().unwrap_or_else(|_| unreachable!()), true, &public, None, None)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap_or_else(|_| unreachable!()));
        }
        headers
    }

    #[test]
    fn hosts_are_the_loopback_names_any_address_and_the_public_ones() {
        let access = access(&["Dash.Example.com"]);
        for host in ["localhost", "localhost:8080", "127.0.0.1:8080", "[::1]:8080", "10.1.2.3", "dash.example.com:443"]
        {
            assert!(access.is_own_host(host), "{host}");
        }
        for host in ["evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "a@localhost", "", "dash"] {
            assert!(!access.is_own_host(host), "{host}");
        }
    }

    #[test]
    fn an_origin_is_checked_against_the_list_and_not_only_against_host() {
        let access = access(&["dash.example.com"]);
        let own = |pairs: &[(&'static str, &str)]| access.is_own_origin(&headers(pairs));
        assert!(own(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")]));
        assert!(own(&[("host", "127.0.0.1:8080"), ("origin", "https://dash.example.com")]), "behind a proxy");
        assert!(!own(&[("host", "evil.example:8080"), ("origin", "http://evil.example:8080")]), "rebinding");
        assert!(!own(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:9000")]), "another local port");
        assert!(!own(&[("host", "127.0.0.1:8080"), ("origin", "null")]));
        assert!(own(&[("host", "127.0.0.1:8080"), ("sec-fetch-site", "same-origin")]));
        assert!(!own(&[("host", "127.0.0.1:8080")]));
    }

    #[test]
    fn actions_on_a_public_address_need_authentication() {
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap_or_else(|_| unreachable!());
        let error = Access::from_args(any, true, &[], None, None).unwrap_err().to_string();
        assert!(error.contains("--auth-token-file") && !error.contains('\n'), "{error}");
        assert!(Access::from_args(any, false, &[], None, None).is_ok(), "read-only is allowed");
        assert!(Access::from_args(any, true, &[], None, Some("X-Forwarded-User")).is_ok());
    }

    #[test]
    fn a_token_is_taken_as_bearer_or_as_the_basic_auth_password() {
        let access = Access {
            public_hosts: Vec::new(),
            token: Some(Token(b"0123456789abcdef".to_vec())),
            trusted_user_header: None,
        };
        let basic = |user_pass: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(user_pass));
        let user = |value: &str| access.authenticate(&headers(&[("authorization", value)])).map(|user| user.0);
        assert_eq!(user("Bearer 0123456789abcdef"), Ok(Some("token".to_owned())));
        assert_eq!(user(&basic("ops:0123456789abcdef")), Ok(Some("ops".to_owned())));
        assert_eq!(user("Bearer 0123456789abcdeX"), Err(Refusal::Unauthenticated));
        assert_eq!(user(&basic("ops:0123456789abcde")), Err(Refusal::Unauthenticated));
        assert_eq!(user("Basic !!!"), Err(Refusal::Unauthenticated));
        assert_eq!(access.authenticate(&HeaderMap::new()).map(|user| user.0), Err(Refusal::Unauthenticated));
    }
}
