//! The dashboard (`GET /`) in a real browser: Debian's `chromium`, headless, loads the page
//! while `tern bench` drives traffic through the broker, and the test reads the DOM the page
//! built. Two loads of the page must show live numbers that moved between them, the charts
//! must hold samples, and the clients table must list the load's clients. `.ci/run` installs
//! chromium when it is missing; `TERN_SKIP_BROWSER=1` skips this test on a machine without it.

mod common;

use std::process::{Child, Command, Stdio};

use common::Broker;
use common::http::get;

/// Virtual time each page load runs for (chromium pauses it while fetches are pending, so
/// the page's one-second polls each complete).
const VIRTUAL_TIME_BUDGET_MS: u32 = 4_000;

/// Kills the load generator when the test ends, however it ends.
struct Load(Child);

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_load(b: &Broker) -> Load {
    let child = Command::new(common::bin())
        .args(["bench", "pubsub", "--port", &b.port().to_string()])
        .args(["--publishers", "2", "--subscribers", "2", "--qos", "1"])
        .args(["-n", "100000000", "--timeout-s", "120", "-q"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tern bench");
    Load(child)
}

/// Loads `url` in headless chromium and returns the DOM after the virtual time budget.
fn dump_dom(url: &str) -> String {
    let out = common::tools::tool("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!("--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}"))
        .args(["--dump-dom", url])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run chromium (apt-get install chromium, or TERN_SKIP_BROWSER=1)");
    assert!(out.status.success(), "chromium failed: {:?}", out.status);
    String::from_utf8(out.stdout).expect("UTF-8 DOM")
}

/// The `data-NAME` attribute of the element with `id`.
fn data_attr(dom: &str, id: &str, name: &str) -> Option<f64> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let tag_end = at + dom[at..].find('>')?;
    let tag_start = dom[..at].rfind('<')?;
    let tag = &dom[tag_start..tag_end];
    let key = format!("data-{name}=\"");
    let from = tag.find(&key)? + key.len();
    let len = tag[from..].find('"')?;
    tag[from..from + len].parse().ok()
}

#[test]
fn the_dashboard_shows_live_numbers_in_a_browser() {
    if std::env::var_os("TERN_SKIP_BROWSER").is_some() {
        eprintln!("TERN_SKIP_BROWSER set: skipped");
        return;
    }
    let b = Broker::start_with_args("", &["--bind", "127.0.0.1:0", "--http", "127.0.0.1:0"]);
    let http = b.http.expect("http listener");
    let page = get(http, "/");
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .is_some_and(|t| t.starts_with("text/html"))
    );
    // Nothing is loaded from outside: no URL with a scheme or protocol-relative source.
    for outside in ["http://", "https://", "src=\"//", "href=\"//", "@import"] {
        assert!(!page.body.contains(outside), "the page loads {outside}...");
    }
    let _load = start_load(&b);
    // The load's 2 publishers and 2 subscribers are connected and messages flow before the
    // page is loaded (bounded wait).
    let deadline = std::time::Instant::now() + common::WAIT * 4;
    loop {
        let clients = get(http, "/api/v1/clients").json();
        let metrics = common::prom::parse(&get(http, "/metrics").body).expect("metrics");
        let flowing = metrics.sum("tern_messages_received_total") > 0.0;
        if clients["items"].as_array().map(Vec::len) == Some(4) && flowing {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the load never started: {clients}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let url = format!("http://{http}/");
    let first = dump_dom(&url);
    let second = dump_dom(&url);
    for dom in [&first, &second] {
        assert!(
            data_attr(dom, "c-rate", "samples") >= Some(2.0),
            "rate chart: {dom}"
        );
        assert!(
            data_attr(dom, "c-fsync", "samples") >= Some(2.0),
            "fsync chart"
        );
        assert!(
            data_attr(dom, "c-conn", "samples") >= Some(2.0),
            "connections chart"
        );
        assert!(
            data_attr(dom, "c-disk", "samples") >= Some(2.0),
            "disk chart"
        );
        assert_eq!(
            data_attr(dom, "v-connections", "value"),
            Some(4.0),
            "4 bench clients"
        );
        assert!(
            data_attr(dom, "c-disk-now", "value") > Some(0.0),
            "disk use"
        );
        assert!(
            dom.contains("tern-bench-"),
            "clients table lists the load's clients"
        );
        assert!(dom.contains(">disconnect<"), "disconnect buttons");
    }
    let received = |dom: &str| data_attr(dom, "v-received", "value").expect("messages in");
    let sent = |dom: &str| data_attr(dom, "v-sent", "value").expect("messages out");
    assert!(received(&first) > 0.0);
    assert!(
        received(&second) > received(&first),
        "messages in did not move"
    );
    assert!(sent(&second) > sent(&first), "messages out did not move");
}
