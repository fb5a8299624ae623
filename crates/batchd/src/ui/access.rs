//! Who the dashboard answers. Every request must name one of the dashboard's own hosts (`Host`, checked by the
//! admin port's [`HostList`]), so a page that rebinds its own DNS name to the dashboard's address (DNS rebinding)
//! gets nothing: its requests carry its name. When authentication is configured, every request must also carry the
//! token (bearer or basic-auth password) or the user header an authenticating proxy sets, except [`PUBLIC_PATHS`]:
//! the two assets (the same bytes for everyone) and the readiness probe (which says only whether Redis answers).
//! Actions, on top, must come from a page of one of those hosts (`Origin`, checked against the same list, never
//! against `Host` alone): exactly a `--public-host` origin (scheme, name and port), or `http://` and the `Host`
//! the request was sent to when that is `localhost` or an address.
//!
//! The hosts are `localhost`, any IP address (an address cannot be rebound: a page served from it is the dashboard
//! itself), and each `--public-host` name, on any port. Refusals are short plain text that never echoes the request.
//! Under https (a `--public-host` origin that is https, or a proxy's `X-Forwarded-Proto: https`) the session
//! cookie is `__Host-` prefixed and `Secure`.

use std::net::SocketAddr;
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

use crate::admin::HostList;

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

/// The cookie that holds a session's action token on plain http (loopback, an SSH tunnel).
pub const SESSION_COOKIE: &str = "batchd_ui_session";

/// The same cookie under https: the `__Host-` prefix makes the browser keep it only when it was set `Secure`, for
/// the exact host, with `Path=/` and no `Domain`, so neither a sibling subdomain nor a plain-http page can plant
/// or overwrite it.
pub const SECURE_SESSION_COOKIE: &str = "__Host-batchd_ui_session";

/// What the dashboard answers and whom: its host names and its authentication.
#[derive(Debug)]
pub struct Access {
    /// `localhost`, IP addresses and the `--public-host` names.
    hosts: HostList,
    /// The `--public-host` origins (`https://dash.example.com`, `http://ops:8080`), lowercase, without a default
    /// port: an action's `Origin` must be one of them exactly, or the dashboard's own loopback one.
    public_origins: Vec<PublicOrigin>,
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

/// A `--public-host`: the name the browser uses and the origin its pages have.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PublicOrigin {
    /// The host name, lowercase.
    name: String,
    /// `scheme://name[:port]`, lowercase, the port only when it is not the scheme's default.
    origin: String,
    /// Whether the origin is https (the session cookie is then `__Host-` and `Secure`).
    https: bool,
    /// The origin's port (443 or 80 when it names none).
    port: u16,
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
        let public_origins = public_hosts.iter().map(|name| public_origin(name)).collect::<anyhow::Result<Vec<_>>>()?;
        let hosts = HostList::new(public_origins.iter().map(|public| public.name.as_str()))
            .map_err(|why| anyhow::anyhow!("--public-host: {why}"))?;
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
        Ok(Self { hosts, public_origins, token, trusted_user_header })
    }

    /// Whether requests must authenticate.
    pub fn authenticates(&self) -> bool {
        self.token.is_some() || self.trusted_user_header.is_some()
    }

    /// Whether an action comes from a page of the dashboard: an `Origin` that is exactly one of the `--public-host`
    /// origins (scheme, name and port; a proxy may rewrite `Host`), or `http://` followed by exactly the `Host` the
    /// request was sent to when that names `localhost` or an address (the dashboard itself serves plain http);
    /// without `Origin`, the browser's own `Sec-Fetch-Site: same-origin`.
    pub fn is_own_origin(&self, headers: &HeaderMap) -> bool {
        let text = |name: HeaderName| headers.get(name).and_then(|value| value.to_str().ok());
        match text(header::ORIGIN) {
            Some(origin) if origin != "null" => {
                let Some(origin) = normalized_origin(origin) else { return false };
                if self.public_origins.iter().any(|public| public.origin == origin.text) {
                    return true;
                }
                // The loopback case: the page was served by the dashboard itself, under the name the request names.
                origin.scheme == "http"
                    && !self.hosts.is_configured(&origin.name)
                    && self.hosts.is_own_name(&origin.name)
                    && text(header::HOST).is_some_and(|host| host.eq_ignore_ascii_case(origin.authority))
            }
            _ => text(HeaderName::from_static("sec-fetch-site")) == Some("same-origin"),
        }
    }

    /// Whether the request was served under https: its `Host` names a `--public-host` whose origin is https (on
    /// that origin's port, or without a port), or the proxy in front says so (`X-Forwarded-Proto: https`; a client
    /// that forges it only gets a cookie its browser will not send over plain http).
    pub fn is_https(&self, headers: &HeaderMap) -> bool {
        let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
        let host_name = text("host").and_then(|host| host.parse::<Authority>().ok());
        let public_https = host_name.is_some_and(|authority| {
            self.public_origins.iter().any(|public| {
                public.https
                    && public.name.eq_ignore_ascii_case(authority.host())
                    && authority.port_u16().is_none_or(|port| port == public.port)
            })
        });
        public_https || text("x-forwarded-proto").is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
    }

    /// The name of the session cookie for this request: [`SECURE_SESSION_COOKIE`] under https, otherwise
    /// [`SESSION_COOKIE`]. Only that one is read, so under https a cookie planted without the prefix is ignored.
    pub fn session_cookie(&self, headers: &HeaderMap) -> &'static str {
        if self.is_https(headers) { SECURE_SESSION_COOKIE } else { SESSION_COOKIE }
    }

    /// The `Set-Cookie` value of a new session token for this request: `__Host-` and `Secure` under https.
    pub fn session_set_cookie(&self, headers: &HeaderMap, token: &str) -> String {
        if self.is_https(headers) {
            format!("{SECURE_SESSION_COOKIE}={token}; Path=/; Secure; HttpOnly; SameSite=Strict")
        } else {
            format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict")
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

/// An `Origin` (or a `--public-host` origin) taken apart: the scheme, the authority as sent, the host name, and
/// the whole, lowercase, without the scheme's default port.
#[derive(Debug)]
struct Origin<'a> {
    /// `http` or `https`.
    scheme: &'static str,
    /// The authority as written (`127.0.0.1:8080`).
    authority: &'a str,
    /// The host name, lowercase.
    name: String,
    /// `scheme://name[:port]`, lowercase, the port left out when it is the scheme's default.
    text: String,
    /// The port, the scheme's default when none is written.
    port: u16,
}

/// `http(s)://host[:port]` with nothing else (no user, path, query or fragment); `None` otherwise.
fn normalized_origin(origin: &str) -> Option<Origin<'_>> {
    let (scheme, authority, default_port) = if let Some(rest) = origin.strip_prefix("http://") {
        ("http", rest, 80)
    } else if let Some(rest) = origin.strip_prefix("https://") {
        ("https", rest, 443)
    } else {
        return None;
    };
    if authority.is_empty() || authority.contains(['@', '/', '?', '#']) {
        return None;
    }
    let parsed = authority.parse::<Authority>().ok()?;
    let name = parsed.host().to_ascii_lowercase();
    let port = parsed.port_u16().unwrap_or(default_port);
    let text = if port == default_port { format!("{scheme}://{name}") } else { format!("{scheme}://{name}:{port}") };
    Some(Origin { scheme, authority, name, text, port })
}

/// A `--public-host` value: a host name (or address), meaning the origin `https://NAME` (a proxy with TLS on
/// 443), or a whole origin, `http(s)://NAME[:PORT]`, for any other scheme or port.
fn public_origin(value: &str) -> anyhow::Result<PublicOrigin> {
    let refuse = || {
        anyhow::anyhow!(
            "--public-host: {value:?} is not a host name or an origin (give dash.example.com for \
             https://dash.example.com, or the origin the browser shows, e.g. http://ops.internal:8080)"
        )
    };
    if value.contains("://") {
        let origin = normalized_origin(value.strip_suffix('/').unwrap_or(value)).ok_or_else(refuse)?;
        crate::admin::host_name(&origin.name).ok_or_else(refuse)?;
        let https = origin.scheme == "https";
        return Ok(PublicOrigin { https, name: origin.name, origin: origin.text, port: origin.port });
    }
    let name = crate::admin::host_name(value).ok_or_else(refuse)?;
    Ok(PublicOrigin { origin: format!("https://{name}"), name, https: true, port: 443 })
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
    if !access.hosts.admits(headers, request.uri()) {
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
        let access = access(&["Dash.Example.com", "http://ops:8080"]);
        for host in ["localhost", "127.0.0.1:8080", "[::1]:8080", "10.1.2.3", "dash.example.com:443", "ops:9999"] {
            assert!(access.hosts.is_own_host(host), "{host}");
        }
        for host in ["evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "a@localhost", "", "dash"] {
            assert!(!access.hosts.is_own_host(host), "{host}");
        }
    }

    #[test]
    fn a_public_host_is_a_name_meaning_https_or_a_whole_origin() {
        let origin = |value: &str| public_origin(value).map(|public| public.origin).map_err(|e| e.to_string());
        assert_eq!(origin("Dash.Example.com"), Ok("https://dash.example.com".to_owned()));
        assert_eq!(origin("https://dash.example.com:443/"), Ok("https://dash.example.com".to_owned()));
        assert_eq!(origin("http://ops:8080"), Ok("http://ops:8080".to_owned()));
        assert_eq!(origin("http://ops:80"), Ok("http://ops".to_owned()));
        for bad in ["ftp://dash", "https://dash/x", "https://u@dash", "dash:443", "https://", "a b"] {
            assert!(origin(bad).is_err_and(|e| e.contains("--public-host")), "{bad:?}");
        }
    }

    #[test]
    fn a_public_origin_matches_only_with_its_scheme_and_port() {
        let access = access(&["dash.example.com", "http://ops.internal:8080"]);
        let own = |pairs: &[(&'static str, &str)]| access.is_own_origin(&headers(pairs));
        for host in ["127.0.0.1:8080", "dash.example.com", "ops.internal:8080"] {
            assert!(own(&[("host", host), ("origin", "https://dash.example.com")]), "{host}");
            assert!(own(&[("host", host), ("origin", "https://DASH.example.com:443")]), "{host}: the default port");
            assert!(own(&[("host", host), ("origin", "http://ops.internal:8080")]), "{host}");
            for foreign in [
                "http://dash.example.com",
                "https://dash.example.com:8443",
                "http://dash.example.com:443",
                "https://ops.internal:8080",
                "http://ops.internal",
                "http://ops.internal:8081",
            ] {
                assert!(!own(&[("host", host), ("origin", foreign)]), "{host}: {foreign}");
            }
        }
        // A public name passed through as Host is not a loopback origin: only its exact origin is.
        assert!(!own(&[("host", "dash.example.com"), ("origin", "http://dash.example.com")]));
        assert!(!own(&[("host", "127.0.0.1:8080"), ("origin", "https://127.0.0.1:8080")]), "the dashboard is http");
    }

    #[test]
    fn the_session_cookie_is_host_prefixed_and_secure_under_https_only() {
        let access = access(&["dash.example.com", "http://ops.internal:8080"]);
        let set = |pairs: &[(&'static str, &str)]| access.session_set_cookie(&headers(pairs), "t");
        assert_eq!(
            set(&[("host", "dash.example.com")]),
            "__Host-batchd_ui_session=t; Path=/; Secure; HttpOnly; SameSite=Strict"
        );
        assert!(set(&[("host", "127.0.0.1:8080"), ("x-forwarded-proto", "https")]).starts_with("__Host-"));
        for host in ["127.0.0.1:8080", "localhost:8080", "ops.internal:8080"] {
            assert_eq!(set(&[("host", host)]), "batchd_ui_session=t; Path=/; HttpOnly; SameSite=Strict", "{host}");
            assert_eq!(access.session_cookie(&headers(&[("host", host)])), SESSION_COOKIE);
        }
        assert_eq!(access.session_cookie(&headers(&[("host", "dash.example.com:443")])), SECURE_SESSION_COOKIE);
        // The same name on another port is not that https origin (a plain-http listener of the same name).
        let both = self::access(&["https://ops.internal", "http://ops.internal:8080"]);
        assert_eq!(both.session_cookie(&headers(&[("host", "ops.internal:8080")])), SESSION_COOKIE);
        assert_eq!(both.session_cookie(&headers(&[("host", "ops.internal")])), SECURE_SESSION_COOKIE);
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
            hosts: HostList::default(),
            public_origins: Vec::new(),
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
