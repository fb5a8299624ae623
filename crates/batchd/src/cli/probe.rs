//! `batchd probe`: asks a daemon's admin server whether it is alive (`/livez`) or ready (`/readyz`) and exits 0 or
//! 1, for container `HEALTHCHECK`s in images without curl (the distroless image has no shell either).
//!
//! One `GET` over plain HTTP/1.1 with `Connection: close`, within `--timeout` for everything (resolving, connecting,
//! reading); at most [`MAX_RESPONSE_BYTES`] of the answer are read. The address is `admin.listen` unless `--addr` or
//! `--url` says otherwise; an unspecified listen address (`0.0.0.0`, `[::]`) is asked on loopback. It needs no
//! Redis.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{Exit, escape_for_terminal, json_text};
use crate::settings::Settings;

/// Most bytes of an answer read (the admin endpoints answer a few bytes; `/metrics` is not probed).
const MAX_RESPONSE_BYTES: u64 = 64 * 1024;

/// Longest body shown.
const MAX_SHOWN_CHARS: usize = 500;

/// Options of `batchd probe`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// Ask `/readyz` (workers running, Redis reachable) instead of `/livez` (process and workers alive).
    #[arg(long)]
    pub ready: bool,
    /// The admin server's address (default: admin.listen; 0.0.0.0 and [::] are asked on loopback).
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "url")]
    pub addr: Option<String>,
    /// The URL to ask, `http://HOST:PORT[/PATH]` (without a path: /livez, or /readyz with --ready).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Give up after this many seconds (connecting and reading included).
    #[arg(long, default_value_t = 2, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// Print JSON: `{"url":..,"ok":..,"status":..,"body":..,"error":..}`.
    #[arg(long)]
    pub json: bool,
}

/// Where to send the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `host:port` as given (or from admin.listen).
    authority: String,
    /// The request path.
    path: String,
}

impl Target {
    fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }
}

/// The probe's target from the options and `admin.listen`.
fn target(args: &ProbeArgs, listen: &str) -> anyhow::Result<Target> {
    let default_path = if args.ready { "/readyz" } else { "/livez" };
    if let Some(url) = &args.url {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("--url {url:?}: give an http:// URL (the admin server speaks plain HTTP)"))?;
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, default_path),
        };
        if authority.is_empty() || authority.contains(['@', ' ', '?', '#']) || path.contains([' ', '\r', '\n']) {
            bail!("--url {url:?}: expected http://HOST:PORT[/PATH]");
        }
        let authority = if has_port(authority) { authority.to_owned() } else { format!("{authority}:80") };
        return Ok(Target { authority, path: path.to_owned() });
    }
    if let Some(addr) = &args.addr {
        if !has_port(addr) || addr.contains(['/', '@', ' ']) {
            bail!("--addr {addr:?}: expected HOST:PORT");
        }
        return Ok(Target { authority: addr.clone(), path: default_path.to_owned() });
    }
    if listen.is_empty() {
        bail!("admin.listen is empty (the admin server is off): give --addr or --url");
    }
    let addr: SocketAddr = listen.parse().map_err(|_| anyhow!("admin.listen {listen:?} is not an address"))?;
    if addr.port() == 0 {
        bail!("admin.listen {listen:?} picks a free port at start: give --addr or --url");
    }
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(Target { authority: SocketAddr::new(ip, addr.port()).to_string(), path: default_path.to_owned() })
}

/// Whether `authority` ends in `:<port>` (`host:80`, `[::1]:80`; not `::1`).
fn has_port(authority: &str) -> bool {
    let port = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once("]:").map(|(_, port)| port),
        None => authority.split_once(':').map(|(_, port)| port),
    };
    port.is_some_and(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok())
}

/// Status code and body of an HTTP/1.x answer.
fn parse_response(response: &[u8]) -> anyhow::Result<(u16, String)> {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.split(' ');
    let (version, status) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if !version.starts_with("HTTP/1.") {
        bail!("not an HTTP answer: {:?}", status_line.chars().take(80).collect::<String>());
    }
    let status = status.parse::<u16>().map_err(|_| anyhow!("bad status line {status_line:?}"))?;
    Ok((status, body.to_owned()))
}

/// One `GET`, within `timeout`.
async fn get(target: &Target, timeout: Duration) -> anyhow::Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(&target.authority).await.context("connect")?;
        let request =
            format!("GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", target.path, target.authority);
        stream.write_all(request.as_bytes()).await.context("send")?;
        let mut response = Vec::new();
        stream.take(MAX_RESPONSE_BYTES).read_to_end(&mut response).await.context("read")?;
        parse_response(&response)
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| anyhow!("no answer within {} s", timeout.as_secs()))?
}

/// `batchd probe`: exit 0 when the endpoint answers 200, 1 otherwise (with the reason on stderr).
pub async fn probe(settings: &Settings, args: &ProbeArgs) -> anyhow::Result<()> {
    let target = target(args, &settings.admin.listen)?;
    let url = target.url();
    let answer = get(&target, Duration::from_secs(args.timeout)).await;
    let body = |body: &str| {
        let body: String = body.trim_end().chars().take(MAX_SHOWN_CHARS).collect();
        body
    };
    if args.json {
        let report = match &answer {
            Ok((status, text)) => {
                json!({"url": url, "ok": *status == 200, "status": status, "body": body(text), "error": null})
            }
            Err(error) => json!({"url": url, "ok": false, "status": null, "body": null, "error": format!("{error:#}")}),
        };
        println!("{}", json_text(&report, false)?);
    }
    match answer {
        Ok((200, text)) => {
            if !args.json {
                println!("{}", escape_for_terminal(&body(&text)));
            }
            Ok(())
        }
        Ok((status, text)) => {
            Err(Exit { code: 1, message: format!("probe {url}: {status} {}", escape_for_terminal(&body(&text))) }
                .into())
        }
        Err(error) => Err(Exit { code: 1, message: format!("probe {url}: {error:#}") }.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(ready: bool, addr: Option<&str>, url: Option<&str>) -> ProbeArgs {
        ProbeArgs { ready, addr: addr.map(Into::into), url: url.map(Into::into), timeout: 2, json: false }
    }

    #[test]
    fn the_target_comes_from_admin_listen_unless_given() {
        let livez = |authority: &str| Target { authority: authority.into(), path: "/livez".into() };
        assert_eq!(target(&args(false, None, None), "0.0.0.0:9090").unwrap(), livez("127.0.0.1:9090"));
        assert_eq!(target(&args(false, None, None), "[::]:9090").unwrap(), livez("[::1]:9090"));
        assert_eq!(target(&args(false, None, None), "10.0.0.5:9091").unwrap(), livez("10.0.0.5:9091"));
        assert_eq!(target(&args(true, None, None), "127.0.0.1:9090").unwrap().path, "/readyz");
        assert_eq!(target(&args(false, Some("localhost:9"), None), "").unwrap(), livez("localhost:9"));
        let url = target(&args(true, None, Some("http://batchd:9090")), "").unwrap();
        assert_eq!(url.url(), "http://batchd:9090/readyz");
        let url = target(&args(true, None, Some("http://h:1/livez?verbose")), "").unwrap();
        assert_eq!(url.url(), "http://h:1/livez?verbose", "an explicit path wins");
        assert_eq!(target(&args(false, None, Some("http://h/livez")), "").unwrap().authority, "h:80");
    }

    #[test]
    fn targets_that_cannot_work_are_refused() {
        let error = |a: ProbeArgs, listen: &str| target(&a, listen).unwrap_err().to_string();
        assert!(error(args(false, None, None), "").contains("admin server is off"));
        assert!(error(args(false, None, None), "127.0.0.1:0").contains("free port"));
        assert!(error(args(false, None, Some("https://h:1")), "").contains("plain HTTP"));
        assert!(error(args(false, Some("nohost"), None), "").contains("HOST:PORT"));
        assert!(error(args(false, Some("::1"), None), "").contains("HOST:PORT"));
    }

    #[test]
    fn answers_are_read_by_their_status_line() {
        let (status, body) =
            parse_response(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 6\r\n\r\nno go\n").unwrap();
        assert_eq!((status, body.as_str()), (503, "no go\n"));
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(parse_response(b"").is_err());
    }
}
