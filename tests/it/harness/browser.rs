//! A real browser and a real `batchd ui` for the dashboard's tests: Debian's headless Chromium driven through
//! its chromedriver (WebDriver) with the `fantoccini` client, and the dashboard as a `batchd ui` process on a
//! loopback port it picks itself (port 0) and reports. `make deps` installs `chromium` and `chromium-driver`; without them the tests fail saying so.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fantoccini::{Client, ClientBuilder, Locator};

use crate::{World, free_port, workspace_binary};

/// Where Debian's packages put the browser and its driver.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// How long a page element may take to appear (the dashboard answers in milliseconds; Chromium starts slowly on a
/// loaded 2-core machine).
pub const PAGE_WAIT: Duration = Duration::from_secs(30);

/// Waits until `GET url` answers 200; fails naming `what` after [`PAGE_WAIT`].
async fn answers(url: &str, what: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    let started = Instant::now();
    loop {
        if let Ok(response) = http.get(url).send().await
            && response.status() == 200
        {
            return Ok(());
        }
        if started.elapsed() > PAGE_WAIT {
            bail!("{what} did not answer at {url} within {PAGE_WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `check` until it returns `Some`, failing with `what` after `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A headless Chromium session. Dropping it ends the driver (and the browser with it).
#[allow(missing_debug_implementations)]
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
    profile: PathBuf,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless Chromium session with a fresh profile and no
    /// background networking (this machine's network is closed).
    pub async fn start() -> anyhow::Result<Self> {
        for path in [CHROMIUM, CHROMEDRIVER] {
            if !std::path::Path::new(path).exists() {
                bail!("{path} is missing: the browser tests need Debian's chromium and chromium-driver (make deps)");
            }
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start chromedriver")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        answers(&format!("http://{addr}/status"), "chromedriver").await?;
        let profile = std::env::temp_dir().join(format!("batchd-chromium-{}", uuid::Uuid::new_v4().simple()));
        let options = serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--window-size=1300,1000", format!("--user-data-dir={}", profile.display()),
            ],
        });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".to_owned(), options);
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://{addr}"))
            .await
            .context("open a Chromium session")?;
        Ok(Self { client, driver, profile })
    }

    /// Opens `url` and waits for the element `css` on it; returns the element's text.
    pub async fn open(&self, url: &str, css: &str) -> anyhow::Result<String> {
        self.client.goto(url).await.with_context(|| format!("open {url}"))?;
        self.text(css).await
    }

    /// Waits for the element `css` on the current page; returns its text.
    pub async fn text(&self, css: &str) -> anyhow::Result<String> {
        let element = self.wait_for(css).await?;
        Ok(element.text().await?)
    }

    /// Waits for the element `css` on the current page.
    pub async fn wait_for(&self, css: &str) -> anyhow::Result<fantoccini::elements::Element> {
        self.client
            .wait()
            .at_most(PAGE_WAIT)
            .for_element(Locator::Css(css))
            .await
            .with_context(|| format!("no {css} on the page"))
    }

    /// Every element `css` of the current page (none is not an error).
    pub async fn all(&self, css: &str) -> anyhow::Result<Vec<fantoccini::elements::Element>> {
        Ok(self.client.find_all(Locator::Css(css)).await?)
    }

    /// Clicks the element `css` (waiting for it first).
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        self.wait_for(css).await?.click().await.with_context(|| format!("click {css}"))?;
        Ok(())
    }

    /// Ends the session and the driver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A `batchd ui` process on the world's Redis and namespace. Dropping it stops it.
#[derive(Debug)]
pub struct Dashboard {
    /// Its address.
    pub addr: SocketAddr,
    child: Child,
    /// Where its log (stderr) goes.
    log: PathBuf,
}

impl Dashboard {
    /// Starts `batchd ui` with `args` (e.g. `--allow-actions`) on port 0 and waits until it answers on the address
    /// it reports (its `batchd ui: serving http://ADDR/` line on stdout), so no other server can be mistaken for it.
    pub async fn start(world: &World, args: &[&str]) -> anyhow::Result<Self> {
        let name = format!("batchd-ui-{}", uuid::Uuid::new_v4().simple());
        let log = std::env::temp_dir().join(format!("{name}.log"));
        let out = std::env::temp_dir().join(format!("{name}.out"));
        let mut child = Command::new(workspace_binary("batchd")?)
            .env_clear()
            .envs(world.batchd_env())
            .arg("ui")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(args)
            .stdout(std::fs::File::create(&out).context("create the dashboard's stdout")?)
            .stderr(std::fs::File::create(&log).context("create the dashboard's log")?)
            .spawn()
            .context("start batchd ui")?;
        let reported = reported_addr(&mut child, &out, &log).await;
        let _ = std::fs::remove_file(&out);
        let addr = match reported {
            Ok(addr) => addr,
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(&log);
                return Err(error);
            }
        };
        let dashboard = Self { addr, child, log };
        answers(&dashboard.url("/assets/ui.css"), "batchd ui").await?;
        Ok(dashboard)
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// The address `batchd ui` reports on stdout (`batchd ui: serving http://ADDR/ (...)`, written to `out`) once it
/// has bound its listener; fails with its log when it exits first, or after [`PAGE_WAIT`].
async fn reported_addr(child: &mut Child, out: &std::path::Path, log: &std::path::Path) -> anyhow::Result<SocketAddr> {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        if let Some(rest) = text.lines().find_map(|line| line.strip_prefix("batchd ui: serving http://")) {
            let addr = rest.split('/').next().unwrap_or_default();
            return addr.parse().with_context(|| format!("batchd ui reported {addr:?}"));
        }
        if let Some(status) = child.try_wait().context("wait for batchd ui")? {
            bail!("batchd ui exited ({status}) before listening: {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        if started.elapsed() > PAGE_WAIT {
            bail!("batchd ui did not report its address within {PAGE_WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
