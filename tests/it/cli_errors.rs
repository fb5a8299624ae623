//! The exact text of the CLI's most common errors, pinned: each names what is wrong once (no cause repeated), a
//! configuration error names the key and its environment variables, an enum error lists the valid values, a TOML
//! error keeps its lines, and the exit code says which kind it is (1 error, 2 usage, 5 not found, 78 configuration).

use batchd_tests::World;

use crate::cli_operator::cli_with;

/// One error: the arguments, extra environment, the exit code and the whole of stderr.
struct Case {
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    code: i32,
    stderr: String,
}

fn case(args: &[&str], env: &[(&'static str, &str)], code: i32, stderr: impl Into<String>) -> Case {
    Case {
        args: args.iter().map(|arg| arg.to_string()).collect(),
        env: env.iter().map(|(name, value)| (*name, value.to_string())).collect(),
        code,
        stderr: stderr.into(),
    }
}

#[tokio::test]
async fn the_most_common_errors_read_exactly_so() {
    let world = World::new().await;
    // The namespace has its consumer group, as one a daemon ran in: no warning joins the errors below.
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", &world.keys.submit(), "batchd", "$", "MKSTREAM"])
        .query_async(&mut world.conn.clone())
        .await
        .expect("XGROUP CREATE");
    let ns = world.settings.redis.namespace.clone();
    let bad_toml = world.redis.dir.join("bad.toml");
    std::fs::write(&bad_toml, "[redis]\nurl = \"redis://127.0.0.1:1\"\n[poll\n").unwrap();
    let bad_toml = bad_toml.display().to_string();
    let items = world.redis.dir.join("items.jsonl");
    std::fs::write(&items, "{\"text\":\"a\"}\n").unwrap();
    let items = items.display().to_string();
    let config = "batchd: configuration:";
    let cases = vec![
        // Not found (5).
        case(
            &["status", "no-such-job"],
            &[],
            5,
            format!(
                "batchd: no job no-such-job in namespace {ns} (never enqueued, not taken in yet, or its ledger expired)"
            ),
        ),
        case(
            &["cancel", "nosuch"],
            &[],
            5,
            format!(
                "batchd: no job nosuch in namespace {ns} (not taken in yet, never enqueued, or its ledger expired); to \
                 cancel it when it arrives, within 604800s, add --before-arrival"
            ),
        ),
        case(
            &["uncancel", "nosuch"],
            &[],
            5,
            format!("batchd: no cancellation of job nosuch is pending in namespace {ns}"),
        ),
        case(
            &["dead", "show", "1-0"],
            &[],
            5,
            format!("batchd: no dead-letter entry 1-0 in {{{ns}}}:dead (see `batchd dead list`)"),
        ),
        // Errors (1).
        case(
            &["status", "bad id"],
            &[],
            1,
            "batchd: job id \"bad id\" contains ' '; allowed characters are A-Z a-z 0-9 . _ : -",
        ),
        case(
            &["dead", "show", "abc"],
            &[],
            1,
            "batchd: \"abc\" is not a stream entry id (<ms>-<seq>, as `batchd dead list` shows)",
        ),
        case(
            &["submit", "/nonexistent/job.json"],
            &[],
            1,
            "batchd: cannot read /nonexistent/job.json: No such file or directory (os error 2)",
        ),
        case(
            &["stats"],
            &[("REDIS_URL", "redis://127.0.0.1:1")],
            1,
            "batchd: cannot reach Redis at redis://127.0.0.1:1: redis: Connection refused (os error 111)",
        ),
        // Usage (2).
        case(
            &["dead", "purge"],
            &[],
            2,
            "batchd: dead purge needs dead-letter entry ids (from `batchd dead list`), or --all to delete every entry \
             (see --help)",
        ),
        case(&["tail", "--status", "failed"], &[], 2, "batchd: unexpected argument '--status' found (see --help)"),
        case(
            &["tail", "--from", "now"],
            &[],
            2,
            "batchd: invalid value 'now' for '--from <ENTRY_ID>': \"now\" is not an entry id (<ms>-<seq>) (see --help)",
        ),
        case(
            &["tail", "--from-start", "--from", "1-0"],
            &[],
            2,
            "batchd: the argument '--from-start' cannot be used with '--from <ENTRY_ID>' (see --help)",
        ),
        case(
            &["jobs", "--state", "bogus"],
            &[],
            2,
            "batchd: invalid value 'bogus' for '--state <STATE>': expected one of accepted, running, completed, \
             failed, expired, cancelled (see --help)",
        ),
        case(
            &["failed", "--state", "completed"],
            &[],
            2,
            "batchd: invalid value 'completed' for '--state <STATE>': expected one of failed, expired, cancelled (see \
             --help)",
        ),
        case(
            &["tail", "--stream", "{other}:results:x"],
            &[],
            2,
            format!(
                "batchd: --stream \"{{other}}:results:x\": not a results stream of namespace {ns} (give \
                 {{{ns}}}:results:<suffix>, or just <suffix>)"
            ),
        ),
        case(
            &["submit", &items, "--model", "@cf/baai/bge-m3", "--reply-to", "a b"],
            &[],
            2,
            format!(
                "batchd: --reply-to \"a b\": a suffix is 1-200 characters of A-Z a-z 0-9 . _ : - (give \
                 {{{ns}}}:results:<suffix>, or just <suffix>)"
            ),
        ),
        case(
            &["stats", "--since", "9d"],
            &[],
            2,
            "batchd: --since: at most 8 days back (the hourly counters are kept for 8 days)",
        ),
        case(
            &["frob"],
            &[],
            2,
            "batchd: unrecognized subcommand 'frob' tip: a similar subcommand exists: 'probe' (see --help)",
        ),
        case(
            &["--namespace", "a b", "stats"],
            &[],
            2,
            "batchd: --namespace: namespace \"a b\" is invalid: use 1-64 characters of A-Z a-z 0-9 . _ -",
        ),
        // Configuration (78): the key and its environment variables, the valid values, the TOML lines.
        case(
            &["stats"],
            &[("REDIS_URL", "http://foo")],
            78,
            format!(
                "{config} redis.url (REDIS_URL or BATCHD__REDIS__URL): \"http://foo\" is not a Redis URL \
                 (redis://[user:password@]host:port[/db], rediss:// for TLS, or unix:///path/to/socket)"
            ),
        ),
        case(
            &["stats"],
            &[("BATCHD__REDIS__MODE", "clustr")],
            78,
            format!(
                "{config} redis.mode (BATCHD__REDIS__MODE): \"clustr\" is not one of standalone, cluster, sentinel"
            ),
        ),
        case(
            &["stats"],
            &[("BATCHD__LOG__FORMAT", "xml")],
            78,
            format!("{config} log.format (BATCHD__LOG__FORMAT): \"xml\" is not one of text, json, journald"),
        ),
        case(
            &["stats"],
            &[("BATCHD__POLL__MAX_INTERVAL_MS", "soon")],
            78,
            format!(
                "{config} poll.max_interval_ms (BATCHD__POLL__MAX_INTERVAL_MS): expected an integer, got string \
                 \"soon\" (in the environment)"
            ),
        ),
        case(
            &["stats"],
            &[("BATCHD__POLL__TYPO", "1")],
            78,
            format!(
                "{config} poll.typo (BATCHD__POLL__TYPO): no such key; [poll] has initial_interval_ms, multiplier, \
                 max_interval_ms, max_interval_ms_with_events, jitter"
            ),
        ),
        case(
            &["config", "check"],
            &[("CLOUDFLARE_API_TOKEN", "tok"), ("CLOUDFLARE_ACCOUNT_ID", "")],
            78,
            format!(
                "{config} cloudflare.account_id (CLOUDFLARE_ACCOUNT_ID or BATCHD__CLOUDFLARE__ACCOUNT_ID): not set (the \
                 Cloudflare account's id)"
            ),
        ),
        case(
            &["run"],
            &[],
            78,
            format!(
                "{config} cloudflare.api_token (CLOUDFLARE_API_TOKEN or BATCHD__CLOUDFLARE__API_TOKEN): not set; set it, \
                 or cloudflare.api_token_file (BATCHD__CLOUDFLARE__API_TOKEN_FILE)"
            ),
        ),
        case(
            &["--config", "/nonexistent/batchd.toml", "stats"],
            &[],
            78,
            format!("{config} config file /nonexistent/batchd.toml does not exist"),
        ),
        case(
            &["--config", &bad_toml, "stats"],
            &[],
            78,
            format!(
                "{config} {bad_toml}: TOML parse error at line 3, column 6\n  |\n3 | [poll\n  |      ^\nunclosed table, \
                 expected `]`"
            ),
        ),
    ];
    assert!(cases.len() >= 20, "the 20 most common errors, at least");
    for Case { args, env, code, stderr: expected } in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
        let (actual, _, stderr) = cli_with(&world, &args, &env).await;
        assert_eq!(stderr.trim_end(), expected, "{args:?} {env:?}");
        assert_eq!(actual, *code, "{args:?} {env:?}: {stderr}");
        // Each cause once: no sentence of it appears twice.
        let parts: Vec<&str> = stderr.split(": ").filter(|part| part.len() > 12).collect();
        for (i, part) in parts.iter().enumerate() {
            assert!(!parts[i + 1..].contains(part), "{args:?}: {part:?} is repeated in {stderr}");
        }
    }
}
