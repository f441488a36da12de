//! MQTT.js (npm `mqtt`) in a real browser (Debian's `chromium`, headless) over WebSocket
//! (issue 13). A tiny HTTP server on 127.0.0.1 serves a test page and `mqtt.min.js`; the page
//! connects to the broker's ws:// listener, subscribes, publishes, and writes what it received
//! into the page; `chromium --dump-dom` prints the page, and the test reads the DOM.
//!
//! No timing: the page holds its own `load` event (and so the DOM dump) with an image that the
//! HTTP server answers only once the page asked for `/done`, which it does after writing its
//! result (or an error, or after its own 20 s limit).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::Broker;
use common::tools::{repo_root, run};

/// Bound on the page's wait for `/done` (the page gives up at 20 s on its own).
const HOLD_LIMIT: Duration = Duration::from_secs(40);

fn mqtt_bundle() -> PathBuf {
    // npm comes from Debian (`scripts/debdeps.sh`, run by the first `tool` call).
    drop(common::tools::tool("npm"));
    let script = repo_root().join("scripts/jsdeps.sh");
    let out = run(Command::new("bash").arg(&script), Duration::from_secs(300));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout.lines().last().unwrap_or("").trim().to_string();
    assert!(
        out.status.success() && !path.is_empty(),
        "MQTT.js is needed and {} could not provide it:\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(path)
}

fn page(ws_port: u16, protocol_version: u8) -> String {
    format!(
        r#"<!doctype html><html><body><div id="out">pending</div>
<script src="/mqtt.min.js"></script>
<script>
const out = document.getElementById('out');
let finished = false;
function finish(text) {{
  if (finished) return;
  finished = true;
  out.textContent = text;
  fetch('/done').catch(() => {{}});
}}
setTimeout(() => finish('timeout'), 20000);
try {{
  const client = mqtt.connect('ws://127.0.0.1:{ws_port}/mqtt', {{
    clientId: 'chromium-v{protocol_version}', protocolVersion: {protocol_version}, reconnectPeriod: 0 }});
  client.on('connect', () => {{
    client.subscribe('browser/t', {{ qos: 1 }}, (err) => {{
      if (err) {{ finish('subscribe error ' + err); return; }}
      client.publish('browser/t', 'hello from chromium v{protocol_version}', {{ qos: 1 }});
    }});
  }});
  client.on('message', (topic, payload) => {{
    finish('received ' + topic + ': ' + payload.toString());
    client.end();
  }});
  client.on('error', (e) => finish('error ' + e));
}} catch (e) {{ finish('exception ' + e); }}
</script>
<img src="/hold" alt="">
</body></html>"#
    )
}

/// The page's HTTP server: `/`, `/mqtt.min.js`, `/hold` (answered once `/done` came).
fn serve_page(html: String, bundle: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let content = Arc::new((html, bundle));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (done, content) = (done.clone(), content.clone());
            std::thread::spawn(move || answer(stream, &done, &content));
        }
    });
    addr
}

fn answer(mut stream: TcpStream, done: &(Mutex<bool>, Condvar), content: &(String, Vec<u8>)) {
    let mut request = String::new();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    if reader.read_line(&mut request).is_err() {
        return;
    }
    let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (status, kind, body): (&str, &str, &[u8]) = match path.as_str() {
        "/" => ("200 OK", "text/html", content.0.as_bytes()),
        "/mqtt.min.js" => ("200 OK", "text/javascript", &content.1),
        "/done" => {
            *done.0.lock().unwrap() = true;
            done.1.notify_all();
            ("204 No Content", "text/plain", b"")
        }
        "/hold" => {
            let guard = done.0.lock().unwrap();
            let _ = done.1.wait_timeout_while(guard, HOLD_LIMIT, |d| !*d);
            ("204 No Content", "image/gif", b"")
        }
        _ => ("404 Not Found", "text/plain", b""),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

/// The `<div id="out">` text of the DOM chromium dumped.
fn out_div(dom: &str) -> &str {
    let start = dom.find("<div id=\"out\">").map(|i| i + 14).unwrap_or(0);
    let end = dom[start..]
        .find("</div>")
        .map(|i| start + i)
        .unwrap_or(dom.len());
    &dom[start..end]
}

#[test]
fn mqtt_js_in_chromium_over_websocket() {
    let bundle = std::fs::read(mqtt_bundle()).unwrap();
    let mut broker = Broker::start_with_args(
        "[[listener]]\nbind = \"127.0.0.1:0\"\ntransport = \"ws\"\n",
        &[],
    );
    let ws = broker.listener_addrs(1)[0];
    for version in [4u8, 5] {
        let http = serve_page(page(ws.port(), version), bundle.clone());
        let profile = tempfile::tempdir().unwrap();
        let out = run(
            common::tools::tool("chromium")
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                ])
                .arg(format!("--user-data-dir={}", profile.path().display()))
                .arg("--dump-dom")
                .arg(format!("http://{http}/")),
            Duration::from_secs(90),
        );
        let dom = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out_div(&dom),
            format!("received browser/t: hello from chromium v{version}"),
            "DOM:\n{dom}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
