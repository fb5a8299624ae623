//! The API token never shows in `Debug` or `Display` output of the client, its settings or its errors.

use std::time::Duration;

use batchd_cloudflare::{ApiToken, BatchClient, ClientBuildError, ClientSettings};

use crate::fake::{self, Canned, FakeApi};

fn assert_no_token(what: &str, text: &str) {
    assert!(!text.contains(fake::TOKEN), "{what} shows the token: {text}");
}

#[tokio::test]
async fn the_token_is_never_printed() {
    let echo = format!("Authorization header was: Bearer {}", fake::TOKEN);
    let api = FakeApi::start(vec![
        Canned::new(400, fake::error_body(3003, &echo)),
        Canned::new(502, format!("<html><title>{echo}</title></html>")),
    ])
    .await;
    let settings = fake::settings_for(api.addr, Duration::from_secs(5));
    let client = BatchClient::new(settings.clone()).expect("client");
    assert_no_token("settings", &format!("{settings:?}"));
    assert_no_token("token", &format!("{:?} {}", settings.token, settings.token));
    assert_no_token("client", &format!("{client:?}"));

    let mut errors = Vec::new();
    for _ in 0..2 {
        errors.push(client.submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail"));
    }
    let refused = fake::client_for(
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr"),
        Duration::from_secs(1),
    );
    errors.push(refused.submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail"));
    for error in &errors {
        assert_no_token("error", &format!("{error:?} {error} {:?}", error.to_job_error()));
    }
    assert!(errors[0].message.contains("Bearer [redacted]"), "{}", errors[0].message);
}

#[test]
fn build_errors_do_not_show_the_token() {
    let bad = |token: &str, account: &str, base_url: &str| {
        let settings = ClientSettings {
            base_url: base_url.to_owned(),
            ..ClientSettings::new(account, ApiToken::new(token.to_owned()))
        };
        BatchClient::new(settings).expect_err("should fail")
    };
    let error = bad("tok-SECRET-4f9a2c\u{7f}", "acct", "https://api.cloudflare.com/client/v4");
    assert!(matches!(error, ClientBuildError::InvalidToken(_)));
    assert_no_token("build error", &format!("{error:?} {error}"));
    assert!(matches!(bad("  \n", "acct", "https://x.test"), ClientBuildError::InvalidToken(_)));
    assert!(matches!(bad(fake::TOKEN, "a/b", "https://x.test"), ClientBuildError::InvalidAccountId(_)));
    assert!(matches!(bad(fake::TOKEN, "acct", "x.test"), ClientBuildError::InvalidBaseUrl { .. }));
}

/// A server that echoes the token where an error message is cut short (400 characters of a JSON message, 200 of
/// a page title or a body) must not leave part of it behind: the cut would hide the token from a search for the
/// whole string.
#[tokio::test]
async fn a_token_echoed_where_the_message_is_cut_is_not_printed_in_part() {
    let prefix = &fake::TOKEN[..8];
    let mut replies = Vec::new();
    for keep in [3, 8, 12] {
        let pad = |limit: usize| "x".repeat(limit - keep);
        replies.push(Canned::new(400, fake::error_body(5004, &format!("{} Bearer {}", pad(400 - 8), fake::TOKEN))));
        replies.push(Canned::new(502, format!("<html><title>{} {}</title></html>", pad(199), fake::TOKEN)));
        replies.push(Canned::new(200, format!("not json {} {}", pad(190), fake::TOKEN)));
    }
    let n_replies = replies.len();
    let api = FakeApi::start(replies).await;
    let client = fake::client_for(api.addr, Duration::from_secs(5));
    for _ in 0..n_replies {
        let error = client.submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
        let text = format!("{error:?} {error} {:?}", error.to_job_error());
        assert!(!text.contains(prefix), "part of the token is shown: {text}");
    }
}
