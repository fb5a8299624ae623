//! The harness's own guarantees, which every other test relies on without seeing them: a Redis it starts is the
//! one answering its port, and a port it hands out is not handed out again.

use std::collections::HashSet;

use batchd_tests::{RedisServer, free_port};

#[tokio::test]
async fn a_redis_server_whose_port_is_answered_by_another_is_refused_and_start_takes_another_port() {
    let first = RedisServer::start().await;
    let error = RedisServer::start_on(first.port).await.expect_err("the port is taken by the first server");
    let message = format!("{error:#}");
    assert!(
        message.contains("the port is taken") || message.contains("answered by another redis-server"),
        "the clash is named: {message}"
    );
    // The first server is untouched and still answers as itself.
    let mut conn = batchd_tests::test_connection(&first.url()).await;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await.expect("INFO");
    assert!(info.contains(&format!("process_id:{}", first.pid().expect("running"))), "{info}");
    let second = RedisServer::start().await;
    assert_ne!(second.port, first.port);
}

#[test]
fn free_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .expect("ip_local_port_range")
        .split_whitespace()
        .next()
        .and_then(|low| low.parse().ok())
        .expect("a number");
    let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
    assert!(ports.iter().all(|port| *port < ephemeral_low), "{ports:?}");
    assert_eq!(ports.iter().collect::<HashSet<_>>().len(), ports.len(), "{ports:?}");
}
