//! A real headless browser for the dashboard tests: Debian's `chromium` driven through
//! `chromedriver` (WebDriver) with fantoccini. The driver and the browser are children of the
//! test and die with it; each browser gets a fresh profile directory, removed on drop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::gateway::unique_name;
use crate::poll_until;
use crate::server::on_a_free_port;

/// Flags for a shared, offline CI machine: no sandbox (root), no GPU, nothing phoning home.
const CHROMIUM_FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
];

/// Viewport widths of the screenshots.
pub const DESKTOP: (u32, u32) = (1280, 800);
pub const PHONE: (u32, u32) = (390, 844);

pub struct Browser {
    pub client: Client,
    _driver: Child,
    profile: PathBuf,
}

/// How long a chromedriver may take to answer `/status` on a loaded machine.
const DRIVER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// chromedriver on `port`, once it answers `/status` ready: its process and address. A port
/// taken between being found free and being bound (the driver exits), or a driver not ready in
/// time, is an error, and [`on_a_free_port`] tries another port.
async fn launch_driver(port: u16) -> Result<(Child, String), String> {
    let mut cmd = Command::new("chromedriver");
    cmd.arg(format!("--port={port}"));
    crate::tie_to_test(&mut cmd);
    let mut driver = cmd.spawn().map_err(|e| {
        format!("chromedriver not found ({e}): install chromium and chromium-driver (scripts/test does)")
    })?;
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + DRIVER_READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = driver.try_wait() {
            return Err(format!("chromedriver exited: {status}"));
        }
        let ready = match http.get(format!("{url}/status")).send().await {
            Ok(answer) => answer
                .json::<Value>()
                .await
                .ok()
                .and_then(|body| body["value"]["ready"].as_bool()),
            Err(_) => None,
        };
        if ready == Some(true) {
            return Ok((driver, url));
        }
        if std::time::Instant::now() >= deadline {
            let _ = driver.start_kill();
            return Err(format!("not ready within {DRIVER_READY_TIMEOUT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless chromium session.
    pub async fn start() -> Browser {
        let (driver, url) = on_a_free_port(launch_driver)
            .await
            .unwrap_or_else(|e| panic!("chromedriver did not start:\n{e}"));
        let profile = std::env::temp_dir().join(unique_name("dashboard-chromium"));
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        args.push(format!("--window-size={},{}", DESKTOP.0, DESKTOP.1));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({ "binary": "/usr/bin/chromium", "args": args }),
        );
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .expect("a chromium session through chromedriver");
        Browser {
            client,
            _driver: driver,
            profile,
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("navigate");
    }

    pub async fn find(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css}: {e}"))
    }

    pub async fn fill(&self, css: &str, value: &str) {
        let field = self.find(css).await;
        field.clear().await.expect("clear field");
        field.send_keys(value).await.expect("type");
    }

    pub async fn click(&self, css: &str) {
        self.find(css).await.click().await.expect("click");
    }

    /// Clicks something that loads a new page (a submit button, a link) and waits until the
    /// new document is there, so that what is read next is not the old page's.
    pub async fn click_and_load(&self, css: &str) {
        self.client
            .execute("window.__before_click = true", vec![])
            .await
            .expect("mark the page");
        self.click(css).await;
        poll_until(
            &format!("a new page after clicking {css}"),
            Duration::from_secs(10),
            Duration::from_millis(50),
            || async {
                let old = self
                    .client
                    .execute(
                        "return document.readyState === 'complete' ? window.__before_click === true : true",
                        vec![],
                    )
                    .await
                    .ok()?;
                (old == Value::Bool(false)).then_some(())
            },
        )
        .await;
    }

    pub async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.expect("text")
    }

    pub async fn value(&self, css: &str) -> String {
        self.find(css)
            .await
            .prop("value")
            .await
            .expect("value")
            .unwrap_or_default()
    }

    pub async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("url")
            .path()
            .to_owned()
    }

    /// Waits (at most 10 s) until the browser is on `path`: a click on a submit button may
    /// return before the navigation it starts has finished.
    pub async fn wait_for_path(&self, path: &str) {
        poll_until(
            &format!("the browser to reach {path}"),
            Duration::from_secs(10),
            Duration::from_millis(50),
            || async { (self.path().await == path).then_some(()) },
        )
        .await;
    }

    /// The whole page at this viewport width, as a PNG in `dir/name-label.png`.
    pub async fn screenshot(
        &self,
        dir: &Path,
        name: &str,
        label: &str,
        (width, height): (u32, u32),
    ) {
        self.client
            .set_window_size(width, height)
            .await
            .expect("resize");
        // The window's height is the viewport's plus the browser's own bars.
        let full = self
            .client
            .execute(
                "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight",
                vec![],
            )
            .await
            .ok()
            .and_then(|h| h.as_u64())
            .unwrap_or(height.into());
        let full = u32::try_from(full).unwrap_or(height).clamp(height, 4000);
        self.client
            .set_window_size(width, full)
            .await
            .expect("resize");
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::create_dir_all(dir).expect("screenshot folder");
        std::fs::write(dir.join(format!("{name}-{label}.png")), png).expect("write screenshot");
        self.client
            .set_window_size(DESKTOP.0, DESKTOP.1)
            .await
            .expect("resize");
    }
}

impl Browser {
    /// Ends the session, which closes the browser.
    /// After the sign-up form of `gw` was submitted for `email`: follows the link mailed to
    /// it (the gateway's log), confirms, and signs in with `password`, as a user would.
    pub async fn verify_and_sign_in(&self, gw: &crate::Gateway, email: &str, password: &str) {
        let link = crate::visitor::verification_link(gw, email).await;
        self.goto(&link).await;
        self.click_and_load("#confirm").await;
        self.goto(&format!("{}/developers/sign-in", gw.api)).await;
        self.fill("#email", email).await;
        self.fill("#password", password).await;
        self.click_and_load("button[type=submit]").await;
        self.wait_for_path("/developers").await;
    }

    pub async fn quit(self) {
        let _ = self.client.clone().close().await;
    }
}

/// The browser processes started with this profile: the ones killing chromedriver would
/// leave behind (a failed test never reaches [`Browser::quit`]).
fn processes_using(profile: &Path) -> Vec<i32> {
    let needle = format!("--user-data-dir={}", profile.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

impl Drop for Browser {
    fn drop(&mut self) {
        for pid in processes_using(&self.profile) {
            // SAFETY: kill(2) with a pid we just read and a plain signal number.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
