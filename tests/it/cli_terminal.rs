//! The CLI on a terminal (a pseudo-terminal from `script`, as an operator's shell would give it): `dead purge`
//! asks before deleting and refuses without a terminal unless told `--yes`, `NO_COLOR` turns every styling off,
//! and `completions` prints a script for each shell.

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
