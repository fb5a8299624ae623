//! Other Redis deployments: TLS with an ACL user, Redis Cluster (3 masters on loopback), Sentinel (1 master,
//! 1 replica, 1 sentinel) with a failover the daemon must follow, and Sentinel over mutual TLS (a TLS-only master and
//! a TLS-only sentinel) where a plain URL must fail rather than connect in clear.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchd_core::{JobId, Keys, ResultStatus};
use batchd_emulator::{Emulator, EmulatorConfig, EmulatorHandle};
use batchd_tests::{Daemon, bge_m3_job, free_port, test_settings};
use redis::AsyncCommands;

const WAIT: Duration = Duration::from_secs(60);

/// A redis-server (or sentinel) process, killed on drop.
struct Process {
    child: Child,
}

impl Process {
    fn spawn(args: &[String]) -> Self {
        let child = Command::new("redis-server")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        Self { child }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("batchd-it-{label}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("test setup");
    dir
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn ping(client: &redis::Client) -> bool {
    match client.get_multiplexed_async_connection().await {
        Ok(mut conn) => redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok(),
        Err(_) => false,
    }
}

async fn emulator() -> EmulatorHandle {
    Emulator::start(EmulatorConfig::default(), "127.0.0.1:0".parse().expect("test setup")).await.expect("test setup")
}

/// Enqueues `ids` and waits for their results through `conn`, checking each completed exactly once.
async fn run_jobs<C: redis::aio::ConnectionLike + Clone + Send + Sync>(conn: &C, keys: &Keys, ids: &[String]) {
    let mut conn = conn.clone();
    for id in ids {
        let _: String =
            conn.xadd(keys.submit(), "*", &[("job", bge_m3_job(id, 2).to_string())]).await.expect("test setup");
    }
    let started = Instant::now();
    loop {
        let entries: Vec<(String, HashMap<String, String>)> =
            redis::cmd("XRANGE").arg(keys.results()).arg("-").arg("+").query_async(&mut conn).await.unwrap_or_default();
        let done: Vec<&str> = entries.iter().map(|(_, fields)| fields["job_id"].as_str()).collect();
        if ids.iter().all(|id| done.contains(&id.as_str())) {
            for id in ids {
                assert_eq!(done.iter().filter(|d| **d == id).count(), 1, "{id} published once");
            }
            assert!(entries.iter().all(|(_, fields)| fields["status"] == ResultStatus::Completed.as_str()));
            return;
        }
        assert!(started.elapsed() < WAIT, "only {}/{} results", done.len(), ids.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn make_certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let status =
            Command::new("openssl").args(args).current_dir(dir).stderr(Stdio::null()).status().expect("test setup");
        assert!(status.success(), "openssl {args:?}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=batchd-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").expect("test setup");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
    ]);
}

#[tokio::test]
async fn tls_with_an_acl_user_and_a_private_ca() {
    let dir = temp_dir("tls");
    make_certificates(&dir);
    let port = free_port();
    let d = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let _redis = Process::spawn(
        &[
            args(&[
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]),
            vec![
                "--dir".into(),
                d(""),
                "--tls-cert-file".into(),
                d("server.crt"),
                "--tls-key-file".into(),
                d("server.key"),
            ],
            vec!["--tls-ca-cert-file".into(), d("ca.crt")],
            args(&[
                "--tls-auth-clients",
                "no",
                "--user",
                "default",
                "off",
                "--user",
                "batchd",
                "on",
                ">s3cret",
                "~*",
                "&*",
                "+@all",
            ]),
        ]
        .concat(),
    );
    let url = format!("rediss://batchd:s3cret@127.0.0.1:{port}");
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(std::fs::read(dir.join("ca.crt")).expect("test setup")),
    };
    let client = redis::Client::build_with_tls(url.as_str(), certificates).expect("test setup");
    wait_until("the TLS server", || ping(&client)).await;

    // Without the CA the server is not trusted; with a wrong password the ACL refuses.
    let untrusted = redis::Client::open(url.as_str()).expect("test setup");
    assert!(!ping(&untrusted).await, "a server signed by an unknown CA must not be trusted");

    let emulator = emulator().await;
    let mut settings = test_settings(&url, &emulator, "tls");
    settings.redis.tls_ca_file = d("ca.crt");
    let daemon = Daemon::start(settings.clone(), &emulator);
    let conn = client.get_multiplexed_async_connection().await.expect("test setup");
    let ids: Vec<String> = (0..3).map(|i| format!("tls-{i}")).collect();
    run_jobs(&conn, &settings.keys(), &ids).await;
    daemon.stop().await.expect("test setup");

    let mut wrong = settings.clone();
    wrong.redis.url = batchd::settings::Secret::new(format!("rediss://batchd:wrong@127.0.0.1:{port}"));
    let endpoint = wrong.redis_endpoint().expect("test setup");
    let mut conn = endpoint.shared().expect("test setup");
    let refused: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
    let error = refused.expect_err("wrong password refused").to_string();
    assert!(error.contains("WRONGPASS") || error.to_lowercase().contains("auth"), "{error}");
}

#[tokio::test]
async fn redis_cluster_runs_the_pipeline_and_namespaces_land_on_different_slots() {
    let dir = temp_dir("cluster");
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let _nodes: Vec<Process> = ports
        .iter()
        .map(|port| {
            Process::spawn(
                &[
                    args(&[
                        "--port",
                        &port.to_string(),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--save",
                        "",
                    ]),
                    vec!["--cluster-config-file".into(), format!("nodes-{port}.conf")],
                    // The cluster bus port from the harness's pool too: by default it is the port plus 10,000,
                    // which can fall in the kernel's ephemeral range and be taken by any outgoing connection (a
                    // cold `make test` once lost a node that way and waited 60 s for it).
                    vec!["--cluster-port".into(), free_port().to_string()],
                    vec!["--dir".into(), dir.to_string_lossy().into_owned(), "--appendonly".into(), "no".into()],
                ]
                .concat(),
            )
        })
        .collect();
    for port in &ports {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("test setup");
        wait_until("a cluster node", || ping(&client)).await;
    }
    let mut create = Command::new("redis-cli");
    create.arg("--cluster").arg("create");
    for port in &ports {
        create.arg(format!("127.0.0.1:{port}"));
    }
    let status =
        create.args(["--cluster-replicas", "0", "--cluster-yes"]).stdout(Stdio::null()).status().expect("test setup");
    assert!(status.success(), "redis-cli --cluster create");
    let seeds: Vec<String> = ports.iter().map(|port| format!("redis://127.0.0.1:{port}")).collect();
    let cluster = redis::cluster::ClusterClient::new(seeds.clone()).expect("test setup");
    wait_until("cluster_state:ok", || async {
        let Ok(mut conn) =
            redis::Client::open(seeds[0].as_str()).expect("test setup").get_multiplexed_async_connection().await
        else {
            return false;
        };
        let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut conn).await.unwrap_or_default();
        info.contains("cluster_state:ok")
    })
    .await;
    let conn = cluster.get_async_connection().await.expect("test setup");

    // One daemon serving two namespaces, each its own hash tag and so its own slot.
    let emulator = emulator().await;
    let mut settings = test_settings(&seeds[0], &emulator, "alpha");
    settings.redis.extra_namespaces = vec!["omega".to_owned()];
    settings.redis.mode = batchd::settings::RedisMode::Cluster;
    settings.redis.nodes = seeds[1..].iter().map(batchd::settings::Secret::new).collect();
    let daemon = Daemon::start(settings.clone(), &emulator);
    let mut slots = Vec::new();
    for keys in settings.all_keys() {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(keys.submit())
            .query_async(&mut conn.clone())
            .await
            .expect("test setup");
        let same: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(keys.job(&JobId::parse("x").expect("test setup")))
            .query_async(&mut conn.clone())
            .await
            .expect("test setup");
        assert_eq!(slot, same, "all keys of a namespace share one slot");
        slots.push(slot);
        let ids: Vec<String> = (0..4).map(|i| format!("{}-{i}", keys.namespace())).collect();
        run_jobs(&conn, &keys, &ids).await;
    }
    assert_ne!(slots[0], slots[1], "the namespaces spread over the cluster");
    // batchd's Redis functions reached every primary (FUNCTION LOAD at start), so an operator's FCALL works
    // whichever slot its namespace lands on.
    for port in &ports {
        let mut node = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .expect("test setup")
            .get_multiplexed_async_connection()
            .await
            .expect("test setup");
        let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(batchd_queue::functions::library_name())
            .query_async(&mut node)
            .await
            .expect("function list");
        assert_eq!(libraries.len(), 1, "the node on port {port} has batchd's functions");
    }
    let mut batchd_conn = settings.redis_endpoint().expect("endpoint").shared().expect("cluster connection");
    for keys in settings.all_keys() {
        let job_id = JobId::parse(&format!("{}-0", keys.namespace())).expect("id");
        let state = batchd_queue::functions::cancel(&mut batchd_conn, &keys, &job_id, Duration::from_secs(60), "done")
            .await
            .expect("FCALL cancel on the namespace's slot");
        assert_eq!(state, "completed", "a finished job is left alone");
    }
    daemon.stop().await.expect("test setup");
}

#[tokio::test]
async fn sentinel_failover_is_followed() {
    let dir = temp_dir("sentinel");
    let (master_port, replica_port, sentinel_port) = (free_port(), free_port(), free_port());
    let common = |port: u16| {
        args(&["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"])
            .into_iter()
            .chain([dir.to_string_lossy().into_owned()])
            .collect::<Vec<String>>()
    };
    let _master = Process::spawn(&common(master_port));
    let _replica =
        Process::spawn(&[common(replica_port), args(&["--replicaof", "127.0.0.1", &master_port.to_string()])].concat());
    let conf = dir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sentinel_port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n",
            dir.display()
        ),
    )
    .expect("test setup");
    let _sentinel = Process::spawn(&[conf.to_string_lossy().into_owned(), "--sentinel".into()]);
    let sentinel_client = redis::Client::open(format!("redis://127.0.0.1:{sentinel_port}")).expect("test setup");
    wait_until("the sentinel", || ping(&sentinel_client)).await;
    let replica = redis::Client::open(format!("redis://127.0.0.1:{replica_port}")).expect("test setup");
    wait_until("replication", || async {
        let Ok(mut conn) = replica.get_multiplexed_async_connection().await else { return false };
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap_or_default();
        info.contains("master_link_status:up")
    })
    .await;

    let emulator = emulator().await;
    let mut settings = test_settings("redis://127.0.0.1:1", &emulator, "sentinel");
    settings.redis.mode = batchd::settings::RedisMode::Sentinel;
    settings.redis.nodes = vec![batchd::settings::Secret::new(format!("redis://127.0.0.1:{sentinel_port}"))];
    let keys = settings.keys();
    let daemon = Daemon::start(settings.clone(), &emulator);
    let master = redis::Client::open(format!("redis://127.0.0.1:{master_port}")).expect("test setup");
    let before: Vec<String> = (0..3).map(|i| format!("before-{i}")).collect();
    run_jobs(&master.get_multiplexed_async_connection().await.expect("test setup"), &keys, &before).await;

    // Fail over: the replica becomes the master; the old master becomes a replica.
    // The sentinel learns about the replica from the master's INFO (every few seconds); until then it answers
    // NOGOODSLAVE, so ask until it accepts.
    let sentinel = sentinel_client.get_multiplexed_async_connection().await.expect("test setup");
    wait_until("the sentinel to accept a failover", || {
        let mut sentinel = sentinel.clone();
        async move {
            let asked: redis::RedisResult<String> =
                redis::cmd("SENTINEL").arg("FAILOVER").arg("mymaster").query_async(&mut sentinel).await;
            asked.is_ok()
        }
    })
    .await;
    wait_until("the failover", || async {
        let Ok(mut conn) = replica.get_multiplexed_async_connection().await else { return false };
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap_or_default();
        matches!(role.first(), Some(redis::Value::BulkString(role)) if role == b"master")
    })
    .await;
    let after: Vec<String> = (0..3).map(|i| format!("after-{i}")).collect();
    run_jobs(&replica.get_multiplexed_async_connection().await.expect("test setup"), &keys, &after).await;
    assert!(daemon.is_running());
    daemon.stop().await.expect("test setup");
}

/// A TLS-only master (ACL user `batchd`, password `s3cret`) and a TLS-only sentinel (password `sentinel-secret`) that
/// watches it over TLS as `mymaster`. Both ask clients for a certificate signed by the test CA.
struct TlsSentinel {
    /// The master process.
    _master: Process,
    /// The sentinel process.
    _sentinel: Process,
    /// The master's TLS port (it has no plain port).
    master_port: u16,
    /// The sentinel's TLS port (it has no plain port).
    sentinel_port: u16,
}

impl TlsSentinel {
    fn spawn(dir: &Path) -> Self {
        let (master_port, sentinel_port) = (free_port(), free_port());
        let d = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let master = Process::spawn(
            &[
                args(&["--port", "0", "--tls-port", &master_port.to_string(), "--bind", "127.0.0.1", "--save", ""]),
                args(&["--appendonly", "no", "--tls-auth-clients", "yes"]),
                vec!["--dir".into(), d(""), "--tls-cert-file".into(), d("server.crt")],
                vec!["--tls-key-file".into(), d("server.key"), "--tls-ca-cert-file".into(), d("ca.crt")],
                args(&["--user", "default", "off", "--user", "batchd", "on", ">s3cret", "~*", "&*", "+@all"]),
            ]
            .concat(),
        );
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port 0\ntls-port {sentinel_port}\nbind 127.0.0.1\ndir {}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients yes\ntls-replication yes\nrequirepass sentinel-secret\n\
                 sentinel monitor mymaster 127.0.0.1 {master_port} 1\nsentinel auth-user mymaster batchd\n\
                 sentinel auth-pass mymaster s3cret\nsentinel down-after-milliseconds mymaster 1000\n",
                d(""),
                d("server.crt"),
                d("server.key"),
                d("ca.crt"),
            ),
        )
        .expect("test setup");
        let sentinel = Process::spawn(&[conf.to_string_lossy().into_owned(), "--sentinel".into()]);
        Self { _master: master, _sentinel: sentinel, master_port, sentinel_port }
    }
}

/// The test CA, and the server's certificate and key reused as the client's for mutual TLS.
fn client_certificates(dir: &Path) -> redis::TlsCertificates {
    let read = |name: &str| std::fs::read(dir.join(name)).expect("test setup");
    redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig { client_cert: read("server.crt"), client_key: read("server.key") }),
        root_cert: Some(read("ca.crt")),
    }
}

/// PING through the daemon's own connection code with `settings`; `Err` if it cannot get an answer.
async fn ping_through_endpoint(settings: &batchd::settings::Settings) -> Result<(), String> {
    let endpoint = settings.redis_endpoint().map_err(|e| e.to_string())?;
    let mut conn = endpoint.shared().map_err(|e| e.to_string())?;
    let ping = redis::cmd("PING");
    match tokio::time::timeout(WAIT, ping.query_async::<String>(&mut conn)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => panic!("a PING through the endpoint neither answered nor failed in {WAIT:?}"),
    }
}

#[tokio::test]
async fn sentinel_over_mutual_tls_runs_the_pipeline_and_plain_urls_never_connect_in_clear() {
    let dir = temp_dir("sentinel-tls");
    make_certificates(&dir);
    let setup = TlsSentinel::spawn(&dir);
    let (master_port, sentinel_port) = (setup.master_port, setup.sentinel_port);
    let master_url = format!("rediss://batchd:s3cret@127.0.0.1:{master_port}/2");
    let sentinel_url = format!("rediss://:sentinel-secret@127.0.0.1:{sentinel_port}");
    let master = redis::Client::build_with_tls(master_url.as_str(), client_certificates(&dir)).expect("test setup");
    wait_until("the TLS master", || ping(&master)).await;
    let sentinel = redis::Client::build_with_tls(sentinel_url.as_str(), client_certificates(&dir)).expect("test setup");
    // The sentinel itself reaches the master only over TLS: "master" without "disconnected" or "s_down" proves it.
    wait_until("the sentinel to see the master over TLS", || async {
        let Ok(mut conn) = sentinel.get_multiplexed_async_connection().await else { return false };
        let master: HashMap<String, String> =
            redis::cmd("SENTINEL").arg("MASTER").arg("mymaster").query_async(&mut conn).await.unwrap_or_default();
        master.get("flags").is_some_and(|flags| flags == "master")
    })
    .await;

    let emulator = emulator().await;
    let mut settings = test_settings(&master_url, &emulator, "sentinel-tls");
    settings.redis.mode = batchd::settings::RedisMode::Sentinel;
    settings.redis.nodes = vec![batchd::settings::Secret::new(sentinel_url.clone())];
    settings.redis.tls_ca_file = dir.join("ca.crt").to_string_lossy().into_owned();
    settings.redis.tls_cert_file = dir.join("server.crt").to_string_lossy().into_owned();
    settings.redis.tls_key_file = dir.join("server.key").to_string_lossy().into_owned();
    let daemon = Daemon::start(settings.clone(), &emulator);
    // Results are read from database 2 of the master: the database in the master URL reached the daemon too.
    let conn = master.get_multiplexed_async_connection().await.expect("test setup");
    let ids: Vec<String> = (0..3).map(|i| format!("sentinel-tls-{i}")).collect();
    run_jobs(&conn, &settings.keys(), &ids).await;
    assert!(daemon.is_running());
    daemon.stop().await.expect("test setup");
    ping_through_endpoint(&settings).await.expect("the TLS settings reach the master");

    // The same servers through plain URLs: no answer, because nothing is ever sent in clear.
    let mut plain_sentinel = settings.clone();
    plain_sentinel.redis.nodes =
        vec![batchd::settings::Secret::new(format!("redis://:sentinel-secret@127.0.0.1:{sentinel_port}"))];
    ping_through_endpoint(&plain_sentinel).await.expect_err("a plain URL to a TLS-only sentinel fails");
    let mut plain_master = settings.clone();
    plain_master.redis.url = batchd::settings::Secret::new(format!("redis://batchd:s3cret@127.0.0.1:{master_port}/2"));
    ping_through_endpoint(&plain_master).await.expect_err("a plain master URL to a TLS-only master fails");

    // Without the CA the sentinel is not trusted: TLS is really checked, not merely switched on.
    let mut untrusted = settings.clone();
    untrusted.redis.tls_ca_file = String::new();
    let error = ping_through_endpoint(&untrusted).await.expect_err("a sentinel signed by an unknown CA is not trusted");
    assert!(error.contains("certificate"), "{error}");
}
