//! The CLI on a terminal (a pseudo-terminal from `script`, as an operator's shell would give it): `dead purge`
//! asks before deleting and refuses without a terminal unless told `--yes`, `NO_COLOR` turns every styling off,
//! `completions` prints a script for each shell, and every command's human output names the Redis it read and the
//! namespace.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use batchd_tests::{World, bge_m3_job, binary};
use redis::AsyncCommands;
use serde_json::json;

use crate::cli_operator::{cli, cli_json, cli_with};
use crate::cli_ops::{run, text};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn dead_purge_asks_on_a_terminal_and_refuses_without_one_unless_told_yes() {
    let world = World::new().await;
    let daemon = world.daemon();
    for i in 0..3 {
        world.enqueue_raw(&[("payload", format!("not a job {i}"))]).await;
    }
    world.wait_for_results(3, WAIT).await;
    daemon.stop().await.unwrap();
    let dead_len = || {
        let mut conn = world.conn.clone();
        let key = world.keys.dead();
        async move { conn.xlen::<_, usize>(key).await.unwrap() }
    };
    assert_eq!(dead_len().await, 3);
    let listed = cli_json(&world, &["dead", "list", "--json"], 0).await;
    let first = listed[0]["entry_id"].as_str().unwrap().to_owned();

    // Standard input is not a terminal here: no one to ask, so no purge without --yes.
    for args in [vec!["dead", "purge", "--all"], vec!["dead", "purge", first.as_str()]] {
        let (code, stdout, stderr) = cli(&world, &args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            "batchd: dead purge deletes for good: give --yes to confirm (standard input is not a terminal, so there is no one to ask)"
        );
        assert!(stdout.is_empty());
    }
    assert_eq!(dead_len().await, 3, "nothing deleted");

    // On a terminal it asks: "n" keeps everything, "y" deletes.
    for (answer, code, left) in [("n", 1, 3), ("y", 0, 2)] {
        let screen = on_terminal(&world, &format!("dead purge {first}"), &format!("{answer}\n")).await;
        assert!(
            screen.contains(&format!(
                "delete 1 dead-letter entries of namespace {}? [y/N]",
                world.settings.redis.namespace
            )),
            "{screen}"
        );
        assert_eq!(screen_exit(&screen), code, "{answer}: {screen}");
        assert_eq!(dead_len().await, left, "{answer}: {screen}");
    }
    let purged = cli_json(&world, &["dead", "purge", "--all", "--yes", "--json"], 0).await;
    assert_eq!(purged, json!({"namespace": world.settings.redis.namespace, "purged": 2}));
    assert_eq!(dead_len().await, 0);
}

/// Runs `batchd <command>; echo exit=$?` on a pseudo-terminal (`script`, as an operator's shell would), typing
/// `input`; returns what the terminal showed.
async fn on_terminal(world: &World, command: &str, input: &str) -> String {
    let batchd = binary("batchd").expect("batchd binary");
    let mut script = Command::new("script");
    script
        .env_clear()
        .envs(world.batchd_env())
        .env("TERM", "xterm")
        .args(["-qfec", &format!("{} {command}; echo exit=$?", batchd.display()), "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let input = input.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = script.spawn().expect("script");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("type the answer");
        let output = child.wait_with_output().expect("script");
        drop(stdin);
        text(&output.stdout)
    })
    .await
    .expect("join")
}

/// The `exit=N` a command run by [`on_terminal`] ended with.
fn screen_exit(screen: &str) -> i32 {
    screen.lines().rev().find_map(|line| line.trim().strip_prefix("exit=")?.parse().ok()).expect("exit=N on screen")
}

#[tokio::test]
async fn completions_print_a_script_for_each_shell() {
    let world = World::new().await;
    for (shell, marker) in [("bash", "complete -F _batchd"), ("zsh", "#compdef batchd"), ("fish", "complete -c batchd")]
    {
        // No Redis or configuration needed: a broken config file does not matter.
        let (code, stdout, stderr) =
            cli_with(&world, &["completions", shell], &[("BATCHD_CONFIG", "/nonexistent")]).await;
        assert_eq!(code, 0, "{shell}: {stderr}");
        assert!(stdout.contains(marker), "{shell}: {stdout}");
        for command in ["retry", "pause", "resume", "workers", "probe", "dry-run"] {
            assert!(stdout.contains(command), "{shell} completes {command}");
        }
        if shell == "bash" {
            let path = world.redis.dir.join("batchd.bash");
            std::fs::write(&path, &stdout).unwrap();
            let status = Command::new("bash").arg("-n").arg(&path).status().expect("bash");
            assert!(status.success(), "the bash script parses");
        }
    }
    let (code, _, stderr) = cli(&world, &["completions", "tcsh"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("batchd: invalid value 'tcsh' for '<SHELL>'"), "{stderr}");
}

#[tokio::test]
async fn no_color_turns_every_styling_off_on_a_terminal() {
    let world = World::new().await;
    let daemon = world.daemon();
    let styled = on_terminal(&world, "--help", "").await;
    assert!(styled.contains('\u{1b}'), "help is styled on a terminal by default: {styled:?}");
    let plain = with_env_on_terminal(&world, "NO_COLOR=1", "--help").await;
    assert!(!plain.contains('\u{1b}'), "{plain:?}");
    assert!(plain.contains("Usage: batchd"), "{plain}");
    let error = with_env_on_terminal(&world, "NO_COLOR=1", "jobs --state bogus").await;
    assert!(!error.contains('\u{1b}') && error.contains("batchd: invalid value 'bogus'"), "{error:?}");

    // submit --wait: plain progress lines instead of an animated bar.
    let job = world.redis.dir.join("job.json");
    std::fs::write(&job, bge_m3_job("nc-1", 2).to_string()).unwrap();
    let screen =
        with_env_on_terminal(&world, "NO_COLOR=1", &format!("submit --wait --timeout 60 {}", job.display())).await;
    assert!(!screen.contains('\u{1b}'), "{screen:?}");
    assert!(screen.lines().any(|line| line.trim_end() == "nc-1: completed"), "{screen}");
    assert_eq!(screen_exit(&screen), 0, "{screen}");
    daemon.stop().await.unwrap();
}

/// Like [`on_terminal`], with an environment assignment (`NAME=value`) before the command.
async fn with_env_on_terminal(world: &World, assignment: &str, command: &str) -> String {
    let batchd = binary("batchd").expect("batchd binary");
    let mut script = Command::new("script");
    script.env_clear().envs(world.batchd_env()).env("TERM", "xterm").args([
        "-qfec",
        &format!("env {assignment} {} {command}; echo exit=$?", batchd.display()),
        "/dev/null",
    ]);
    text(&run(script).await.stdout)
}

/// The human output of every command that reads a namespace, as an operator's terminal shows it, names where it
/// read: the namespace and the Redis endpoint, its password masked. Warnings say when the default Redis is read
/// because `REDIS_URL` is unset, and when the namespace has never had a daemon; neither shows once both are right.
#[tokio::test]
async fn every_human_output_names_the_redis_endpoint_and_the_namespace() {
    let world = World::new().await;
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("where-1", 1)).await;
    world.wait_for_result("where-1", WAIT).await;
    world.enqueue_raw(&[("payload", "not a job".to_owned())]).await;
    world.wait_for_results(2, WAIT).await;
    daemon.stop().await.unwrap();
    let dead = cli_json(&world, &["dead", "list", "--json"], 0).await;
    let dead_id = dead[0]["entry_id"].as_str().expect("a dead letter").to_owned();
    // An operator's own ACL user with a password: the URL carries it, no output may.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "operator", "on", ">s3cret-pw", "~*", "&*", "+@all"])
        .query_async(&mut world.conn.clone())
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://operator:s3cret-pw@127.0.0.1:{}", world.redis.port);
    let shown = format!("redis://operator:[redacted]@127.0.0.1:{}", world.redis.port);
    let namespace = world.settings.redis.namespace.clone();
    let place = format!("namespace {namespace} on {shown}");

    let commands: Vec<(Vec<&str>, String)> = vec![
        (vec!["stats"], format!("{place} at ")),
        (vec!["status", "where-1"], format!("job where-1 ({place})")),
        (vec!["jobs"], format!("2 of 2 matching jobs shown (2 ledgers scanned; {place})")),
        (vec!["failed"], format!("{place}: 1 jobs ended without completing")),
        (vec!["workers"], format!("{place}: group batchd on ")),
        (vec!["dead", "list"], format!("1 of 1 dead-letter entries shown ({place})")),
        (vec!["dead", "show", &dead_id], format!("dead-letter entry {dead_id} ({place})")),
        (vec!["retry", "--dry-run"], format!("result entries read from {{{namespace}}}:results (all of it; {place})")),
    ];
    for (args, expected) in &commands {
        let (code, stdout, stderr) = cli_with(&world, args, &[("REDIS_URL", &url)]).await;
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(stdout.lines().any(|line| line.contains(expected.as_str())), "{args:?}: {expected:?} in {stdout}");
        assert!(stderr.is_empty(), "{args:?}: no warning for the right Redis and namespace: {stderr}");
        assert!(!stdout.contains("s3cret-pw") && !stderr.contains("s3cret-pw"), "{args:?}: the password shows");
    }
    // tail names them in its header, on stderr (its stdout is the entries).
    let (code, _, stderr) =
        cli_with(&world, &["tail", "--from-start", "--count", "2", "--timeout", "30"], &[("REDIS_URL", &url)]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr.trim_end(), format!("following {{{namespace}}}:results on {shown} from the start"));
    // On a terminal too, as an operator sees it.
    let screen = on_terminal(&world, &format!("--namespace {namespace} stats"), "").await;
    assert!(screen.contains(&format!("namespace {namespace} on {} at ", world.redis.url())), "{screen}");

    // The wrong namespace: told on stderr, the output still says which one was read.
    let (code, stdout, stderr) = cli(&world, &["--namespace", "nobody-here", "stats"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with(&format!("namespace nobody-here on {} at ", world.redis.url())), "{stdout}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "batchd: warning: namespace nobody-here on {} has no consumer group (no daemon has ever run in it): check \
             --namespace and REDIS_URL",
            world.redis.url()
        )
    );

    // REDIS_URL unset: the default is used, and said so before anything else (also when it cannot be reached).
    let mut command = std::process::Command::new(binary("batchd").expect("batchd binary"));
    command.env_clear().envs(world.batchd_env().into_iter().filter(|(name, _)| *name != "REDIS_URL")).args(["stats"]);
    let output = crate::cli_ops::run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(
        stderr.lines().next(),
        Some("batchd: warning: REDIS_URL is not set; using the default Redis at redis://127.0.0.1:6379"),
        "{stderr}"
    );
}
