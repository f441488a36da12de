//! The config file's errors: each names the key and its table (and the line, for what serde
//! refused); values out of range are refused as before the tables were derived.

use super::*;

/// The error of `text`, which must be refused.
fn refused(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

/// The message names `key` and the table, `table` as it appears in the message.
fn assert_names(message: &str, key: &str, table: &str) {
    assert!(message.contains(&format!("`{key}`")), "{key}: {message}");
    assert!(message.contains(table), "{table}: {message}");
}

#[test]
fn an_unknown_key_names_key_and_table() {
    for (text, key, table) in [
        ("[listener]\nport = 1\n", "port", "[listener]"),
        ("[limits]\nmax_packets = 1\n", "max_packets", "[limits]"),
        ("[sys]\ninterval = 1\n", "interval", "[sys]"),
        ("[state]\ninterval_ms = 1\n", "interval_ms", "[state]"),
        ("[store]\nmax_bytes = 1\n", "max_bytes", "[store]"),
        ("[runtime]\nthreads = 1\n", "threads", "[runtime]"),
        ("[http]\nport = 1\n", "port", "[http]"),
        ("[auth]\npasswd = \"x\"\n", "passwd", "[auth]"),
        (
            "[[listener]]\nbind = \"127.0.0.1:0\"\ntls = true\n",
            "tls",
            "[[listener]]",
        ),
        (
            "[[stream]]\nname = \"s\"\nmax_age = 1\n",
            "max_age",
            "[stream]",
        ),
    ] {
        let e = refused(text);
        assert!(e.contains(&format!("unknown field `{key}`")), "{e}");
        assert!(e.contains(table), "{table}: {e}");
    }
    assert!(refused("[nope]\n").contains("`nope`"));
}

#[test]
fn a_value_out_of_range_names_key_and_table() {
    for (text, key, table) in [
        (
            "[limits]\nmax_packet_size_bytes = 63\n",
            "max_packet_size_bytes",
            "[limits]",
        ),
        (
            "[limits]\nreceive_maximum = -1\n",
            "receive_maximum",
            "[limits]",
        ),
        (
            "[limits]\nmax_inflight_messages = 65535\n",
            "max_inflight_messages",
            "[limits]",
        ),
        (
            "[limits]\nconnect_timeout_ms = 1.5\n",
            "connect_timeout_ms",
            "[limits]",
        ),
        ("[sys]\ninterval_s = -1\n", "interval_s", "[sys]"),
        (
            "[state]\nsync = \"interval\"\nsync_interval_ms = 0\n",
            "sync",
            "[state]",
        ),
        (
            "[store]\nmax_disk_bytes = -1\n",
            "max_disk_bytes",
            "[store]",
        ),
        (
            "[store]\nmax_disk_bytes = 65535\n",
            "max_disk_bytes",
            "[store]",
        ),
        (
            "[[stream]]\nname = \"s\"\nsync = \"interval\"\nsync_interval_ms = 0\n",
            "sync",
            "[stream]",
        ),
        ("[[stream]]\nfilters = [\"a\"]\n", "name", "[stream]"),
        (
            "[[stream]]\nname = \"s\"\nmax_msgs = -1\n",
            "max_msgs",
            "[stream]",
        ),
        (
            "[[stream]]\nname = \"s\"\nblock_size_bytes = \"big\"\n",
            "block_size_bytes",
            "[stream]",
        ),
        ("[[listener]]\nbind = \"nope\"\n", "bind", "[[listener]]"),
        (
            "[[listener]]\nbind = \"127.0.0.1:0\"\nmax_connections = 0\n",
            "max_connections",
            "[[listener]]",
        ),
        (
            "[[listener]]\nbind = \"127.0.0.1:0\"\ntls_key = \"k\"\n",
            "tls_cert",
            "[[listener]]",
        ),
    ] {
        assert_names(&refused(text), key, table);
    }
}

#[test]
fn a_table_of_the_wrong_shape_is_refused_naming_it() {
    let top = |name: &str| format!("`{name}` at the top level, line 1: invalid type: ");
    for (text, place, says) in [
        (
            "limits = 3\n",
            top("limits"),
            "integer `3`, expected a [limits] table",
        ),
        (
            "[stream]\nname = \"x\"\n",
            top("stream"),
            "map, expected [[stream]] tables",
        ),
        (
            "listener = \"127.0.0.1:0\"\n",
            top("listener"),
            "string \"127.0.0.1:0\", expected a [listener] table or [[listener]] tables",
        ),
        (
            "auth = true\n",
            top("auth"),
            "boolean `true`, expected an [auth] table",
        ),
        (
            "http = 1\n",
            top("http"),
            "integer `1`, expected an [http] table",
        ),
        (
            "listener = [1]\n",
            "[[listener]] #1, line 1: invalid type: ".into(),
            "integer `1`, expected a [[listener]] table",
        ),
        (
            "stream = [1]\n",
            "[[stream]] #1, line 1: invalid type: ".into(),
            "integer `1`, expected a [[stream]] table",
        ),
    ] {
        assert_eq!(refused(text), format!("{place}{says}"));
    }
}

#[test]
fn worker_threads_bounds() {
    assert_eq!(parse("").unwrap().worker_threads, None, "one per core");
    let c = parse("[runtime]\nworker_threads = 1\n").unwrap();
    assert_eq!(c.worker_threads, Some(1));
    let most = format!(
        "[runtime]\nworker_threads = {}\n",
        tables::MAX_WORKER_THREADS
    );
    assert_eq!(
        parse(&most).unwrap().worker_threads,
        Some(tables::MAX_WORKER_THREADS)
    );
    let over = format!(
        "[runtime]\nworker_threads = {}\n",
        tables::MAX_WORKER_THREADS + 1
    );
    for text in ["[runtime]\nworker_threads = 0\n", over.as_str()] {
        let e = refused(text);
        assert_names(&e, "worker_threads", "[runtime]");
        assert!(e.contains("between 1 and 1024"), "{e}");
    }
    let e = refused("[runtime]\nworker_threads = -1\n");
    assert_names(&e, "worker_threads", "[runtime]");
}

/// The smallest budget, 64 KiB, is accepted when no written stream's block is larger; a
/// memory-only stream's blocks do not count.
#[test]
fn disk_budget_bounds() {
    let c = parse(
        "[store]\nmax_disk_bytes = 65536\n[[stream]]\nname = \"all\"\nblock_size_bytes = 65536\n",
    )
    .unwrap();
    assert_eq!(c.max_disk_bytes, Some(65_536));
    let c = parse(
        "[store]\nmax_disk_bytes = 65536\n[[stream]]\nname = \"mem\"\nfilters = [\"m/#\"]\n\
         durability = \"never\"\n[[stream]]\nname = \"all\"\nblock_size_bytes = 65536\n",
    )
    .unwrap();
    assert_eq!(c.max_disk_bytes, Some(65_536));
    let e = refused(
        "[store]\nmax_disk_bytes = 65536\n[[stream]]\nname = \"all\"\nblock_size_bytes = 65537\n",
    );
    assert_names(&e, "max_disk_bytes", "[store]");
    assert!(e.contains("stream `all`'s block_size_bytes (65537)"), "{e}");
}

/// A value of the wrong type names its key and table, in the derived tables too (`[auth]`,
/// `[http]` and `[[listener]]` used to name only the table).
#[test]
fn a_wrong_type_names_key_and_table() {
    for (text, key, table) in [
        ("[listener]\nbind = 1\n", "bind", "[listener]"),
        (
            "[limits]\nreject_control_chars = 1\n",
            "reject_control_chars",
            "[limits]",
        ),
        ("[sys]\ninterval_s = \"often\"\n", "interval_s", "[sys]"),
        (
            "[state]\nsync_interval_ms = \"1\"\n",
            "sync_interval_ms",
            "[state]",
        ),
        (
            "[store]\nmax_disk_bytes = \"1G\"\n",
            "max_disk_bytes",
            "[store]",
        ),
        ("[http]\ntoken = 1\n", "token", "[http]"),
        (
            "[auth]\nallow_anonymous = \"yes\"\n",
            "allow_anonymous",
            "[auth]",
        ),
        (
            "[[listener]]\nbind = \"127.0.0.1:0\"\nrequire_client_cert = 1\n",
            "require_client_cert",
            "[[listener]]",
        ),
        (
            "[[stream]]\nname = \"s\"\nfilters = \"a/#\"\n",
            "filters",
            "[stream]",
        ),
    ] {
        assert_names(&refused(text), key, table);
    }
}

/// The line is counted in bytes up to toml's span, whatever text comes before it.
#[test]
fn the_line_of_a_refused_value_is_its_own() {
    let e = refused("# débit, 流量\n\n[limits]\nreceive_maximum = \"x\"\n");
    assert!(
        e.starts_with("`receive_maximum` in [limits], line 4: "),
        "{e}"
    );
}
