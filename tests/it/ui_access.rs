//! Who the dashboard answers, against a real `batchd ui` process and a real Redis, over raw HTTP (so `Host` and
//! `Origin` can be forged as a rebinding page or another site would): every route refuses a foreign `Host`; an
//! action whose `Host` and `Origin` both name the attacker (DNS rebinding) or whose `Origin` is another site is
//! refused; `--public-host` names are admitted; with `--auth-token-file` or `--trusted-user-header` every request
//! but the two assets must authenticate; `--allow-actions` on a non-loopback address without authentication does not start; every
//! answer is `no-store`; `?notice=` shows only known codes; a `--public-host` origin matches with its scheme and
//! port, and under https the session cookie is `__Host-` prefixed and `Secure`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use batchd_tests::{World, free_port, workspace_binary};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(30);

/// A session cookie and the form token that goes with it (double submit: they are equal).
const SESSION: &str = "0123456789abcdef0123456789abcdef";

/// A `batchd ui` process; dropping it stops it.
struct Ui {
    /// The port it listens on (on every loopback address when started on 0.0.0.0).
    addr: SocketAddr,
    child: Child,
    log: PathBuf,
}

impl Ui {
    /// Starts `batchd ui --listen <listen-ip>:<free port> <args>` and waits until it answers anything on loopback.
    /// A process that could not bind its port (taken between picking and binding it, by another test's connection)
    /// is started again on another port; any other early exit fails at once with the process's own message.
    async fn start(world: &World, listen_ip: &str, args: &[&str]) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let log = std::env::temp_dir().join(format!("batchd-ui-access-{}.log", uuid::Uuid::new_v4().simple()));
            let child = std::process::Command::new(workspace_binary("batchd").expect("batchd binary"))
                .env_clear()
                .envs(world.batchd_env())
                .args(["ui", "--listen", &format!("{listen_ip}:{port}")])
                .args(args)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .spawn()
                .expect("start batchd ui");
            let mut ui = Self { addr: SocketAddr::from(([127, 0, 0, 1], port)), child, log };
            let started = Instant::now();
            let mut exited = false;
            while send(ui.addr, "GET", "/assets/ui.css", &[], "").await.is_none() {
                if ui.child.try_wait().expect("wait").is_some() {
                    let log = ui.log();
                    assert!(log.contains("Address already in use"), "batchd ui exited: {log}");
                    exited = true;
                    break;
                }
                assert!(started.elapsed() < WAIT, "batchd ui did not answer within {WAIT:?}: {}", ui.log());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !exited {
                return ui;
            }
        }
        panic!("batchd ui found no free port in 5 tries");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `Host` as a browser at `http://127.0.0.1:<port>/` sends it.
    fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// An answer: status, head (header names lowercased) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    /// The value of header `name` (lowercase), if present.
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// One request on a fresh connection with exactly these headers (`Host` included, when given); `None` when the
/// connection is refused.
async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Option<Answer> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" && !body.is_empty() {
        request.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut raw)).await.expect("answered in time").ok()?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some(Answer { status, head: head.to_owned(), body: body.to_owned() })
}

/// `GET path` with `Host: host` and the extra headers.
async fn get(ui: &Ui, host: &str, path: &str, extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![("Host", host)];
    headers.extend_from_slice(extra);
    send(ui.addr, "GET", path, &headers, "").await.unwrap_or_else(|| panic!("GET {path}: no answer"))
}

/// An action `POST` with a consistent session cookie and form token, `Host: host` and `Origin: origin`.
async fn post_action(ui: &Ui, host: &str, origin: &str, path: &str, extra: &[(&str, &str)]) -> Answer {
    let cookie = format!("batchd_ui_session={SESSION}");
    let mut headers = vec![("Host", host), ("Origin", origin), ("Cookie", cookie.as_str())];
    headers.extend_from_slice(extra);
    send(ui.addr, "POST", path, &headers, &format!("token={SESSION}"))
        .await
        .unwrap_or_else(|| panic!("POST {path}: no answer"))
}

/// Every route of the dashboard, as (method, path).
const ROUTES: [(&str, &str); 28] = [
    ("GET", "/"),
    ("GET", "/api/overview"),
    ("GET", "/jobs"),
    ("GET", "/api/jobs"),
    ("GET", "/jobs/some-job"),
    ("GET", "/api/jobs/some-job"),
    ("GET", "/jobs/some-job/items"),
    ("GET", "/api/jobs/some-job/items"),
    ("GET", "/failed"),
    ("GET", "/api/failed"),
    ("GET", "/retry"),
    ("GET", "/api/retry"),
    ("GET", "/dead"),
    ("GET", "/api/dead"),
    ("GET", "/dead/1-0"),
    ("GET", "/api/dead/1-0"),
    ("GET", "/assets/ui.css"),
    ("GET", "/assets/ui.js"),
    ("GET", "/readyz"),
    ("GET", "/no-such-page"),
    ("POST", "/jobs/some-job/cancel"),
    ("POST", "/jobs/some-job/retry"),
    ("POST", "/retry"),
    ("POST", "/dead/1-0/retry"),
    ("POST", "/dead/1-0/purge"),
    ("POST", "/dead/purge"),
    ("POST", "/pause"),
    ("POST", "/resume"),
];

/// The routes answered without authentication: the two assets and the readiness probe.
const PUBLIC: [&str; 3] = ["/assets/ui.css", "/assets/ui.js", "/readyz"];

/// A dead-letter entry to purge (the dead-letter stream's fields as the daemon writes them); returns its path.
async fn dead_letter(world: &World) -> String {
    let id: String = redis::cmd("XADD")
        .arg(world.keys.dead())
        .arg("*")
        .arg("source_id")
        .arg("1-1")
        .arg("error")
        .arg("a test entry")
        .query_async(&mut world.conn.clone())
        .await
        .expect("XADD");
    format!("/dead/{id}/purge")
}

fn assert_no_store(answer: &Answer, what: &str) {
    assert_eq!(answer.header("cache-control"), Some("no-store"), "{what}: {}", answer.head);
}

#[tokio::test]
async fn ui_every_route_refuses_a_foreign_host_and_a_rebinding_page_cannot_act() {
    let world = World::new().await;
    let ui = Ui::start(&world, "127.0.0.1", &["--allow-actions"]).await;
    let evil = format!("rebind.evil.example:{}", ui.addr.port());
    let evil_origin = format!("http://{evil}");

    for (method, path) in ROUTES {
        for host in [evil.as_str(), "localhost.evil.example", "127.0.0.1.nip.io"] {
            let answer = match method {
                "GET" => get(&ui, host, path, &[]).await,
                _ => post_action(&ui, host, &format!("http://{host}"), path, &[]).await,
            };
            assert_eq!(answer.status, 421, "{method} {path} with Host {host}: {answer:?}");
            assert!(answer.body.starts_with("this dashboard answers only to its own host names"), "{answer:?}");
            assert!(!answer.body.contains("evil") && !answer.body.contains("nip"), "never echoed: {}", answer.body);
            assert_eq!(answer.header("content-type"), Some("text/plain; charset=utf-8"));
            assert_no_store(&answer, path);
            assert!(answer.header("content-security-policy").is_some(), "the CSP stays: {}", answer.head);
        }
    }
    // A request without Host, and one whose absolute URI names another host, are refused too.
    let no_host = send(ui.addr, "GET", "/api/overview", &[], "").await.expect("answer");
    assert_eq!(no_host.status, 421, "{no_host:?}");
    let absolute =
        send(ui.addr, "GET", "http://rebind.evil.example/api/overview", &[("Host", &ui.host())], "").await.expect("a");
    assert_eq!(absolute.status, 421, "{absolute:?}");

    // The dashboard's own names are answered: its address, localhost, any IP address.
    let port = ui.addr.port();
    for host in [ui.host(), format!("localhost:{port}"), format!("[::1]:{port}"), "localhost".to_owned()] {
        let answer = get(&ui, &host, "/api/overview", &[]).await;
        assert_eq!(answer.status, 200, "Host {host}: {answer:?}");
        assert_no_store(&answer, "/api/overview");
    }

    // An action from another site is refused by its Origin even with the right Host and a consistent session; so
    // is one from another port of the same machine. Nothing was done: no action is logged.
    for origin in [evil_origin.as_str(), "http://127.0.0.1:1", "null"] {
        let answer = post_action(&ui, &ui.host(), origin, "/dead/1-0/purge", &[]).await;
        assert_eq!(answer.status, 403, "Origin {origin}: {answer:?}");
        assert_no_store(&answer, "refused action");
    }
    // The same action from the dashboard's own page goes through (purging an entry that is not there).
    let own = post_action(&ui, &ui.host(), &format!("http://{}", ui.host()), &dead_letter(&world).await, &[]).await;
    assert_eq!(own.status, 303, "{own:?}");
    assert_no_store(&own, "redirect");
    assert!(world.stream(&world.keys.dead()).await.is_empty(), "the honest purge deleted its entry");
    let log = ui.log();
    let actions: Vec<&str> = log.lines().filter(|line| line.contains("dashboard action")).collect();
    assert_eq!(actions.len(), 1, "only the honest action ran: {log}");
}

#[tokio::test]
async fn ui_public_host_names_are_admitted_for_pages_and_as_the_origin_of_actions() {
    let world = World::new().await;
    let ui = Ui::start(
        &world,
        "127.0.0.1",
        &["--allow-actions", "--public-host", "Dash.Example.com", "--public-host", "ops"],
    )
    .await;
    for host in ["dash.example.com", "DASH.example.com:443", "ops:8080"] {
        assert_eq!(get(&ui, host, "/api/overview", &[]).await.status, 200, "Host {host}");
    }
    for host in ["other.example.com", "dash.example.com.evil.example"] {
        assert_eq!(get(&ui, host, "/api/overview", &[]).await.status, 421, "Host {host}");
    }
    // Behind a proxy that rewrites Host to the upstream address, the public name is the browser's Origin.
    let answer = post_action(&ui, &ui.host(), "https://dash.example.com", &dead_letter(&world).await, &[]).await;
    assert_eq!(answer.status, 303, "{answer:?}");
    let answer = post_action(&ui, &ui.host(), "https://other.example.com", "/dead/1-0/purge", &[]).await;
    assert_eq!(answer.status, 403, "{answer:?}");
}

/// An action `POST` with the session cookie named `cookie` (its value and the form token consistent).
async fn post_with_cookie(ui: &Ui, host: &str, origin: &str, cookie: &str, path: &str) -> Answer {
    let cookie = format!("{cookie}={SESSION}");
    let headers = [("Host", host), ("Origin", origin), ("Cookie", cookie.as_str())];
    send(ui.addr, "POST", path, &headers, &format!("token={SESSION}"))
        .await
        .unwrap_or_else(|| panic!("POST {path}: no answer"))
}

/// A `--public-host` is an origin (a bare name means `https://NAME`): an action's `Origin` must be it exactly,
/// scheme and port included, and a public name passed through as `Host` is never taken as a plain-http origin.
/// Under https (that public name, or a proxy's `X-Forwarded-Proto: https`) the session cookie is
/// `__Host-batchd_ui_session`, `Secure`, `Path=/`, without `Domain`, and only that cookie is read; on plain http
/// loopback it stays `batchd_ui_session` without `Secure`.
#[tokio::test]
async fn ui_an_origin_matches_a_public_host_with_its_scheme_and_port_and_https_gets_a_host_prefixed_cookie() {
    let world = World::new().await;
    let public = ["--public-host", "dash.example.com", "--public-host", "http://ops.internal:8080"];
    let ui = Ui::start(&world, "127.0.0.1", &[&["--allow-actions"][..], &public[..]].concat()).await;
    const PLAIN: &str = "batchd_ui_session";
    const SECURE: &str = "__Host-batchd_ui_session";

    // The cookie a first page view sets.
    let cookie_of = |answer: &Answer| answer.header("set-cookie").map(str::to_owned).expect("a session cookie");
    for (host, extra) in [("dash.example.com", None), ("DASH.example.com:443", None), (&ui.host()[..], Some("https"))] {
        let headers: Vec<(&str, &str)> = extra.map(|proto| ("X-Forwarded-Proto", proto)).into_iter().collect();
        let cookie = cookie_of(&get(&ui, host, "/", &headers).await);
        assert!(cookie.starts_with(&format!("{SECURE}=")), "Host {host}: {cookie}");
        let attributes: Vec<&str> = cookie.split(';').skip(1).map(str::trim).collect();
        assert_eq!(attributes, ["Path=/", "Secure", "HttpOnly", "SameSite=Strict"], "Host {host}: {cookie}");
    }
    for host in [ui.host(), format!("localhost:{}", ui.addr.port()), "ops.internal:8080".to_owned()] {
        let cookie = cookie_of(&get(&ui, &host, "/", &[]).await);
        assert!(cookie.starts_with(&format!("{PLAIN}=")) && !cookie.contains("Secure"), "Host {host}: {cookie}");
    }

    // Origins: the public ones exactly, whatever Host the proxy passes.
    for host in ["dash.example.com".to_owned(), ui.host(), "ops.internal:8080".to_owned()] {
        for origin in [
            "http://dash.example.com",
            "https://dash.example.com:8443",
            "http://dash.example.com:443",
            "https://ops.internal:8080",
            "http://ops.internal",
            "http://ops.internal:8081",
        ] {
            for cookie in [PLAIN, SECURE] {
                let answer = post_with_cookie(&ui, &host, origin, cookie, "/dead/1-0/purge").await;
                assert_eq!(answer.status, 403, "Host {host}, Origin {origin}: {answer:?}");
            }
        }
    }
    let dead = world.keys.dead();
    // Under https only the __Host- cookie counts: one planted without the prefix (by a sibling subdomain, or over
    // plain http) does not make a session.
    let path = dead_letter(&world).await;
    let answer = post_with_cookie(&ui, "dash.example.com", "https://dash.example.com", PLAIN, &path).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    let answer = post_with_cookie(&ui, "dash.example.com", "https://dash.example.com:443", SECURE, &path).await;
    assert_eq!(answer.status, 303, "{answer:?}");
    assert!(world.stream(&dead).await.is_empty(), "the honest purge deleted its entry");
    // The plain-http public origin, with its port, and the plain cookie.
    let path = dead_letter(&world).await;
    let answer = post_with_cookie(&ui, "ops.internal:8080", "http://ops.internal:8080", PLAIN, &path).await;
    assert_eq!(answer.status, 303, "{answer:?}");
    assert!(world.stream(&dead).await.is_empty(), "the purge from the plain-http origin deleted its entry");
}

#[tokio::test]
async fn ui_with_a_token_file_every_request_must_carry_the_token() {
    let world = World::new().await;
    let dir = std::env::temp_dir().join(format!("batchd-ui-token-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "s3cret-dashboard-token-0001\n").expect("token file");
    // Not loopback, with actions: allowed because it authenticates.
    let ui =
        Ui::start(&world, "0.0.0.0", &["--allow-actions", "--auth-token-file", token_file.to_str().expect("path")])
            .await;
    let host = ui.host();
    let basic = |user_pass: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(user_pass));

    for (method, path) in ROUTES {
        let answer = match method {
            "GET" => get(&ui, &host, path, &[]).await,
            _ => post_action(&ui, &host, &format!("http://{host}"), path, &[]).await,
        };
        if PUBLIC.contains(&path) {
            // The stylesheet and the script are the binary's own text, and /readyz says only whether Redis
            // answers: answered to probes without a token.
            assert_eq!(answer.status, 200, "{path}: {answer:?}");
            continue;
        }
        assert_eq!(answer.status, 401, "{method} {path} without the token: {answer:?}");
        assert_eq!(answer.header("www-authenticate"), Some("Basic realm=\"batchd ui\", charset=\"UTF-8\""));
        assert_no_store(&answer, path);
    }
    for wrong in [
        "Bearer s3cret-dashboard-token-0002".to_owned(),
        "Bearer s3cret-dashboard-token-000".to_owned(),
        basic("ops:s3cret-dashboard-token-0002"),
        basic("s3cret-dashboard-token-0001"),
        "s3cret-dashboard-token-0001".to_owned(),
    ] {
        let answer = get(&ui, &host, "/api/overview", &[("Authorization", &wrong)]).await;
        assert_eq!(answer.status, 401, "{wrong}: {answer:?}");
    }
    for right in ["Bearer s3cret-dashboard-token-0001".to_owned(), basic("ops:s3cret-dashboard-token-0001")] {
        for path in ["/", "/api/overview", "/jobs"] {
            let answer = get(&ui, &host, path, &[("Authorization", &right)]).await;
            assert_eq!(answer.status, 200, "{path} with {right}: {answer:?}");
        }
    }
    // The host check comes first: the right token from a foreign Host is still refused, and so are the assets.
    let answer = get(&ui, "rebind.evil.example", "/", &[("Authorization", "Bearer s3cret-dashboard-token-0001")]).await;
    assert_eq!(answer.status, 421);
    assert_eq!(get(&ui, "rebind.evil.example", "/assets/ui.css", &[]).await.status, 421);
    // An action with the token is carried out and logged with the user.
    let auth = basic("alice:s3cret-dashboard-token-0001");
    let purge = dead_letter(&world).await;
    let answer = post_action(&ui, &host, &format!("http://{host}"), &purge, &[("Authorization", &auth)]).await;
    assert_eq!(answer.status, 303, "{answer:?}");
    let log = ui.log();
    assert!(log.lines().any(|line| line.contains("dashboard action") && line.contains("alice")), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn ui_behind_an_authenticating_proxy_trusts_only_requests_with_its_user_header() {
    let world = World::new().await;
    let ui = Ui::start(&world, "0.0.0.0", &["--allow-actions", "--trusted-user-header", "X-Forwarded-User"]).await;
    let host = ui.host();
    let answer = get(&ui, &host, "/api/overview", &[]).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.header("www-authenticate").is_none(), "no login prompt: the proxy does the login");
    assert_eq!(get(&ui, &host, "/api/overview", &[("X-Forwarded-User", " ")]).await.status, 403);
    assert_eq!(get(&ui, &host, "/api/overview", &[("X-Forwarded-User", "bob")]).await.status, 200);
    let purge = dead_letter(&world).await;
    let answer = post_action(&ui, &host, &format!("http://{host}"), &purge, &[("X-Forwarded-User", "bob")]).await;
    assert_eq!(answer.status, 303, "{answer:?}");
    assert!(ui.log().lines().any(|line| line.contains("dashboard action") && line.contains("bob")), "{}", ui.log());
}

#[tokio::test]
async fn ui_refuses_to_start_with_actions_on_a_public_address_without_authentication() {
    let world = World::new().await;
    let output = world.batchd().args(["ui", "--listen", "0.0.0.0:0", "--allow-actions"]).output().expect("run");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    for needle in ["--allow-actions on 0.0.0.0:0", "--auth-token-file", "--trusted-user-header", "127.0.0.1"] {
        assert!(stderr.contains(needle), "{needle} in: {stderr}");
    }
    // A token too short to be one, and a missing file, are refused the same way.
    let dir = std::env::temp_dir().join(format!("batchd-ui-token-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let short = dir.join("short");
    std::fs::write(&short, "1234\n").expect("write");
    for file in [short.clone(), dir.join("missing")] {
        let output = world
            .batchd()
            .args(["ui", "--listen", "127.0.0.1:0", "--auth-token-file", file.to_str().expect("path")])
            .output()
            .expect("run");
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("--auth-token-file"), "{output:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn ui_answers_are_no_store_and_a_notice_is_a_code_never_text() {
    let world = World::new().await;
    let ui = Ui::start(&world, "127.0.0.1", &[]).await;
    let host = ui.host();
    for path in ["/", "/api/overview", "/jobs", "/api/jobs", "/dead", "/api/dead", "/assets/ui.css", "/nope"] {
        assert_no_store(&get(&ui, &host, path, &[]).await, path);
    }
    let page = get(&ui, &host, "/?notice=dead-purged", &[]).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(r#"data-notice="dead-purged""#), "{}", page.body);
    assert!(page.body.contains("The dead-letter entry was deleted."));
    for forged in ["Your%20session%20expired%3A%20log%20in%20at%20evil.example", "%3Cb%3Ebold%3C%2Fb%3E", "DEAD-PURGED"]
    {
        let page = get(&ui, &host, &format!("/dead?notice={forged}"), &[]).await;
        assert_eq!(page.status, 200, "{forged}");
        assert!(!page.body.contains("id=\"notice\"") && !page.body.contains("evil") && !page.body.contains("bold"));
    }
}

#[tokio::test]
async fn ui_a_read_only_dashboard_answers_403_to_every_post_even_a_bare_one() {
    let world = World::new().await;
    let ui = Ui::start(&world, "127.0.0.1", &[]).await;
    let host = ui.host();
    let origin = format!("http://{host}");
    for (method, path) in ROUTES.into_iter().filter(|(method, _)| *method == "POST") {
        // No Content-Type and no body (what `curl -X POST` sends): refused as disabled, not as a bad form (415).
        let bare = send(ui.addr, method, path, &[("Host", &host)], "").await.expect("answer");
        assert_eq!(bare.status, 403, "bare POST {path}: {bare:?}");
        assert!(bare.body.contains("read-only"), "{path}: {}", bare.body);
        // And the same with everything an honest page would send.
        let full = post_action(&ui, &host, &origin, path, &[]).await;
        assert_eq!(full.status, 403, "POST {path} from the dashboard's page: {full:?}");
    }
    assert!(!ui.log().contains("dashboard action"), "nothing was done: {}", ui.log());
}

#[tokio::test]
async fn ui_starts_while_redis_is_down_says_so_and_recovers_by_itself() {
    let mut world = World::new().await;
    world.redis.kill();
    // Started against a Redis that does not answer: it serves (no exit 1, no restart loop on Kubernetes).
    let mut ui = Ui::start(&world, "127.0.0.1", &["--allow-actions"]).await;
    let host = ui.host();
    for path in ["/", "/jobs", "/dead", "/jobs/some-job"] {
        let answer = get(&ui, &host, path, &[]).await;
        assert_eq!(answer.status, 503, "{path}: {answer:?}");
        assert!(answer.body.contains("Redis unreachable") && answer.body.contains("data-unavailable"), "{path}");
        assert_no_store(&answer, path);
    }
    let ready = get(&ui, &host, "/readyz", &[]).await;
    assert_eq!((ready.status, ready.body.as_str()), (503, "redis unreachable\n"), "{ready:?}");
    // An action cannot be carried out either, and says why.
    let answer = post_action(&ui, &host, &format!("http://{host}"), "/pause", &[]).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(ui.child.try_wait().expect("wait").is_none(), "batchd ui is still running: {}", ui.log());
    assert!(ui.log().contains("Redis unreachable at start"), "the log says why: {}", ui.log());

    // Redis comes back on the same address: the same process answers again, nothing restarted.
    world.redis.restart().await;
    let started = Instant::now();
    loop {
        let (page, ready) = (get(&ui, &host, "/", &[]).await, get(&ui, &host, "/readyz", &[]).await);
        if page.status == 200 && ready.status == 200 {
            assert_eq!(ready.body, "ready\n");
            assert!(page.body.contains("Overview"), "{}", page.body);
            break;
        }
        assert!(started.elapsed() < WAIT, "the dashboard did not recover within {WAIT:?}: {page:?} {ready:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ui.child.try_wait().expect("wait").is_none(), "the same process recovered");
}
