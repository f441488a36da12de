use super::*;
use tern_broker::{Durability, Keep, StreamSpec};

#[test]
fn empty_file_gives_defaults() {
    let c = parse("").unwrap();
    assert_eq!(c.broker, BrokerConfig::default());
    assert_eq!(c.bind, None);
}

#[test]
fn sets_every_table() {
    let c = parse(
        "[listener]\nbind = \"127.0.0.1:0\"\n[limits]\nreceive_maximum = 10\n[sys]\ninterval_s = 0\n",
    )
    .unwrap();
    assert_eq!(c.bind.as_deref(), Some("127.0.0.1:0"));
    assert_eq!(c.broker.receive_maximum, 10);
    assert_eq!(c.broker.sys_interval_s, 0);
}

#[test]
fn streams_are_parsed() {
    let c = parse(
        "[[stream]]\nname = \"s\"\nfilters = [\"a/#\"]\nmax_msgs = 10\nmax_age_s = 60\nsync = \"never\"\ndurability = \"always\"\n[[stream]]\nname = \"rest\"\n",
    )
    .unwrap();
    assert_eq!(c.streams.len(), 2);
    assert_eq!(c.streams[0].filters, vec!["a/#".to_string()]);
    assert_eq!(c.streams[0].store.limits.max_msgs, Some(10));
    assert_eq!(c.streams[0].store.sync, SyncPolicy::Never);
    assert_eq!(c.streams[0].durability, Durability::Always);
    assert_eq!(c.streams[1].store.sync, SyncPolicy::Always);
    assert_eq!(c.streams[0].keep, Keep::Interest, "the default");
    let k = parse("[[stream]]\nname = \"log\"\nkeep = \"retention\"\n").unwrap();
    assert_eq!(k.streams[0].keep, Keep::Retention);
    let e = parse("[[stream]]\nname = \"s\"\nkeep = \"forever\"\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid value for `keep` in [[stream]] #1: `forever` is not one of interest, retention"
    );
    let e = parse("[[stream]]\nname = \"s\"\nsyncc = 1\n").unwrap_err();
    let e = e.to_string();
    assert!(
        e.starts_with(
            "`syncc` in [[stream]] #1, line 3: unknown field `syncc`, expected one of `name`,"
        ),
        "{e}"
    );
    let e = parse("[[stream]]\nname = \"s\"\ndurability = \"sometimes\"\n").unwrap_err();
    assert!(
        e.to_string().contains("`durability` in [[stream]] #1"),
        "{e}"
    );
}

#[test]
fn state_sync_is_its_own_key_not_the_first_streams() {
    let c = parse("[[stream]]\nname = \"fast\"\nfilters = [\"f/#\"]\nsync = \"never\"\n").unwrap();
    assert_eq!(c.streams[0].store.sync, SyncPolicy::Never);
    assert_eq!(
        c.state_sync,
        SyncPolicy::Always,
        "default, whatever the first stream says"
    );
    let c = parse("[state]\nsync = \"interval\"\nsync_interval_ms = 20\n").unwrap();
    assert_eq!(
        c.state_sync,
        SyncPolicy::Interval(Duration::from_millis(20))
    );
    let c = parse("[state]\nsync = \"never\"\n[[stream]]\nname = \"s\"\n").unwrap();
    assert_eq!(c.state_sync, SyncPolicy::Never);
    assert_eq!(c.streams[0].store.sync, SyncPolicy::Always);
    let e = parse("[state]\nsync = \"sometimes\"\n").unwrap_err();
    assert!(e.to_string().contains("`sync` in [state]"), "{e}");
    let e = parse("[state]\nsync = 1\n").unwrap_err();
    assert!(e.to_string().contains("`sync` in [state]"), "{e}");
    let e = parse("[state]\nsyncc = \"always\"\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "`syncc` in [state], line 2: unknown field `syncc`, expected `sync` or `sync_interval_ms`"
    );
}

#[test]
fn a_filtered_stream_named_like_the_default_stream_is_refused() {
    let e = parse("[[stream]]\nname = \"messages\"\nfilters = [\"a/#\"]\n").unwrap_err();
    assert!(e.to_string().contains("[stream]"), "{e}");
    assert!(e.to_string().contains("`messages`"), "{e}");
    // Without filters it is the catch-all itself.
    assert!(parse("[[stream]]\nname = \"messages\"\n").is_ok());
}

#[test]
fn queue_memory_connection_and_disk_limits_are_parsed_and_checked() {
    let c = parse(
        "[limits]\nmax_queued_bytes = 1000\nmax_queued_bytes_total = 5000\nmax_connections = 3\n[store]\nmax_disk_bytes = 8388608\n",
    )
    .unwrap();
    assert_eq!(c.broker.max_queued_bytes, 1000);
    assert_eq!(c.broker.max_queued_bytes_total, 5000);
    assert_eq!(c.broker.max_connections, 3);
    assert_eq!(c.max_disk_bytes, Some(8_388_608));
    assert_eq!(
        parse("").unwrap().max_disk_bytes,
        None,
        "no budget by default"
    );
    assert_eq!(
        parse("[store]\nmax_disk_bytes = 0\n")
            .unwrap()
            .max_disk_bytes,
        None
    );
    let e = parse("[store]\nmax_disk_bytes = 10\n").unwrap_err();
    assert!(e.to_string().contains("`max_disk_bytes` in [store]"), "{e}");
    // Below the default stream's 4 MiB block: nothing could ever be stored.
    let e = parse("[store]\nmax_disk_bytes = 1048576\n").unwrap_err();
    assert!(e.to_string().contains("`max_disk_bytes` in [store]"), "{e}");
    assert!(e.to_string().contains("block_size_bytes (4194304)"), "{e}");
    let e = parse("[store]\nmax_disk_byte = 10\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "`max_disk_byte` in [store], line 2: unknown field `max_disk_byte`, expected `max_disk_bytes`"
    );
    let e = parse("[limits]\nmax_queued_bytes = 0\n").unwrap_err();
    assert!(
        e.to_string().contains("`max_queued_bytes` in [limits]"),
        "{e}"
    );
    let e = parse("[limits]\nmax_queued_bytes = 10\nmax_queued_bytes_total = 9\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("`max_queued_bytes_total` in [limits]"),
        "{e}"
    );
    let e = parse("[limits]\nmax_connections = 0\n").unwrap_err();
    assert!(
        e.to_string().contains("`max_connections` in [limits]"),
        "{e}"
    );
}

#[test]
fn unknown_key_is_named() {
    let e = parse("[limits]\nmax_packet_sizee = 5\n").unwrap_err();
    let e = e.to_string();
    assert!(
        e.starts_with(
            "`max_packet_sizee` in [limits], line 2: unknown field `max_packet_sizee`, \
             expected one of `max_packet_size_bytes`, `receive_maximum`,"
        ),
        "{e}"
    );
    assert!(e.ends_with(", `reject_control_chars`"), "{e}");
    let e = parse("[sys]\ninterval = 5\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "`interval` in [sys], line 2: unknown field `interval`, expected `interval_s`"
    );
    let e = parse("[limitz]\n").unwrap_err();
    assert!(
        e.to_string().starts_with(
            "`limitz` at the top level, line 1: unknown field `limitz`, expected one of \
             `listener`, `limits`, `sys`, `state`, `store`, `runtime`, `http`, `auth`, `stream`"
        ),
        "{e}"
    );
}

#[test]
fn bad_value_is_named() {
    let e = parse("[limits]\nreceive_maximum = \"lots\"\n").unwrap_err();
    assert!(
        e.to_string().contains("`receive_maximum` in [limits]"),
        "{e}"
    );
    let e = parse("[limits]\nreceive_maximum = 70000\n").unwrap_err();
    assert!(
        e.to_string().contains("`receive_maximum` in [limits]"),
        "{e}"
    );
    let e = parse("[limits]\nreceive_maximum = 0\n").unwrap_err();
    assert!(
        e.to_string().contains("`receive_maximum` in [limits]"),
        "{e}"
    );
    let e = parse("[listener]\nbind = \"nope\"\n").unwrap_err();
    assert!(e.to_string().contains("`bind` in [listener]"), "{e}");
}

/// Every key of every single table, each set to a value other than its default.
const EVERY_KEY: &str = r#"
[listener]
bind = "127.0.0.1:1884"
[limits]
max_packet_size_bytes = 2000
receive_maximum = 11
topic_alias_maximum = 12
max_keep_alive_s = 13
connect_timeout_ms = 14
max_inflight_messages = 15
max_queued_messages = 16
max_queued_bytes = 17
max_queued_bytes_total = 18
max_connections = 19
max_session_expiry_interval_s = 20
max_subscriptions_per_session = 21
max_sessions = 22
max_retained_messages = 23
max_client_id_len = 24
outbound_queue_max_bytes = 25
outbound_queue_max_messages = 26
slow_subscriber_timeout_ms = 27
max_topic_levels = 28
max_topic_length_bytes = 29
max_connect_rate_per_ip = 30
connect_rate_burst = 31
reject_control_chars = false
[sys]
interval_s = 32
[state]
sync = "interval"
sync_interval_ms = 33
[store]
max_disk_bytes = 67108864
[http]
bind = "127.0.0.1:8081"
token = "0123456789abcdef"
[auth]
allow_anonymous = false
password_file = "p.txt"
acl_file = "a.acl"
[[stream]]
name = "t"
filters = ["a/#", "b"]
max_age_s = 34
max_msgs = 35
max_bytes = 36
max_msgs_per_topic = 37
block_size_bytes = 65536
sync = "interval"
sync_interval_ms = 38
durability = "never"
keep = "retention"
[[stream]]
name = "u"
durability = "default"
keep = "interest"
sync = "always"
"#;

#[test]
fn every_key_sets_its_field() {
    let c = parse(EVERY_KEY).unwrap();
    assert_eq!(c.bind.as_deref(), Some("127.0.0.1:1884"));
    let limits = BrokerConfig {
        max_packet_size_bytes: 2000,
        receive_maximum: 11,
        topic_alias_maximum: 12,
        max_keep_alive_s: 13,
        connect_timeout_ms: 14,
        max_inflight_messages: 15,
        max_queued_messages: 16,
        max_queued_bytes: 17,
        max_queued_bytes_total: 18,
        max_connections: 19,
        max_session_expiry_interval_s: 20,
        max_subscriptions_per_session: 21,
        max_sessions: 22,
        max_retained_messages: 23,
        max_client_id_len: 24,
        outbound_queue_max_bytes: 25,
        outbound_queue_max_messages: 26,
        slow_subscriber_timeout_ms: 27,
        sys_interval_s: 32,
        max_topic_levels: 28,
        max_topic_length_bytes: 29,
        max_connect_rate_per_ip: 30,
        connect_rate_burst: 31,
        reject_control_chars: false,
        deliver_after_durable: false,
    };
    assert_eq!(c.broker, limits);
    assert_eq!(
        c.state_sync,
        SyncPolicy::Interval(Duration::from_millis(33))
    );
    assert_eq!(c.max_disk_bytes, Some(64 * 1024 * 1024));
    let http = c.http.expect("[http]");
    assert_eq!(http.bind.as_deref(), Some("127.0.0.1:8081"));
    assert_eq!(http.token.as_deref(), Some("0123456789abcdef"));
    assert_eq!(
        c.auth,
        crate::auth_config::AuthConfig {
            allow_anonymous: Some(false),
            password_file: Some("p.txt".into()),
            acl_file: Some("a.acl".into()),
        }
    );
    assert!(c.listeners.is_empty(), "[listener] is the single bind");
    let [t, u] = &c.streams[..] else {
        panic!("{:?}", c.streams)
    };
    assert_eq!(t.name, "t");
    assert_eq!(t.filters, vec!["a/#".to_string(), "b".to_string()]);
    let expected_limits = tern_broker::Limits {
        max_age: Some(Duration::from_secs(34)),
        max_msgs: Some(35),
        max_bytes: Some(36),
        max_msgs_per_topic: Some(37),
        ..Default::default()
    };
    assert_eq!(t.store.limits, expected_limits);
    assert_eq!(t.store.block_size_bytes, 65536);
    assert_eq!(
        t.store.sync,
        SyncPolicy::Interval(Duration::from_millis(38))
    );
    assert_eq!(t.durability, Durability::Never);
    assert_eq!(t.keep, Keep::Retention);
    assert_eq!(u.name, "u");
    assert!(u.filters.is_empty());
    assert_eq!(u.durability, Durability::Default);
    assert_eq!(u.keep, Keep::Interest);
    assert_eq!(u.store.sync, SyncPolicy::Always);
}

#[test]
fn every_listener_key_is_accepted() {
    let c = parse(
        "[[listener]]\nbind = \"127.0.0.1:0\"\n\
         [[listener]]\nbind = \"127.0.0.1:1\"\ntransport = \"ws\"\ntls_cert = \"c.pem\"\n\
         tls_key = \"k.pem\"\ntls_client_ca = \"ca.pem\"\ntls_crl = \"crl.pem\"\n\
         require_client_cert = true\n\
         use_identity_as_username = true\nallow_anonymous = false\nmax_connections = 5\n",
    )
    .unwrap();
    let plain = crate::listeners::ListenerConfig::plain("127.0.0.1:0");
    let full = crate::listeners::ListenerConfig {
        bind: "127.0.0.1:1".into(),
        transport: crate::listeners::TransportName::Ws,
        tls_cert: Some("c.pem".into()),
        tls_key: Some("k.pem".into()),
        tls_client_ca: Some("ca.pem".into()),
        tls_crl: Some("crl.pem".into()),
        require_client_cert: true,
        use_identity_as_username: true,
        allow_anonymous: Some(false),
        max_connections: Some(5),
    };
    assert_eq!(c.listeners, vec![plain, full]);
    assert_eq!(c.bind, None);
}

#[test]
fn defaults_of_an_empty_file_and_of_empty_tables() {
    for text in [
        "",
        "[limits]\n[sys]\n[state]\n[store]\n[auth]\n[listener]\n",
    ] {
        let c = parse(text).unwrap();
        assert_eq!(c.broker, BrokerConfig::default(), "{text}");
        assert_eq!(c.state_sync, SyncPolicy::Always);
        assert_eq!(c.max_disk_bytes, None);
        assert_eq!(c.auth, Default::default());
        assert!(c.http.is_none() && c.listeners.is_empty() && c.streams.is_empty());
        assert_eq!(c.bind, None);
    }
    let c = parse("[http]\n[[stream]]\nname = \"all\"\n").unwrap();
    let http = c.http.expect("an empty [http] is a table");
    assert!(http.bind.is_none() && http.token.is_none());
    let s = &c.streams[0];
    assert_eq!(s.store.sync, SyncPolicy::Always);
    assert_eq!(s.store.limits, tern_broker::Limits::default());
    let default = StreamSpec::default_stream();
    assert_eq!(s.store.block_size_bytes, default.store.block_size_bytes);
    assert_eq!(
        (s.durability, s.keep),
        (Durability::Default, Keep::Interest)
    );
    // `sync_interval_ms` defaults to 100 under `sync = "interval"`.
    let c = parse("[state]\nsync = \"interval\"\n").unwrap();
    assert_eq!(
        c.state_sync,
        SyncPolicy::Interval(Duration::from_millis(DEFAULT_SYNC_INTERVAL_MS))
    );
}

#[test]
fn the_commented_example_config_is_valid() {
    let c = parse(include_str!("../../../../contrib/tern.toml")).unwrap();
    assert_eq!(c.broker, BrokerConfig::default());
    assert_eq!(c.max_disk_bytes, None, "0: no budget");
}
