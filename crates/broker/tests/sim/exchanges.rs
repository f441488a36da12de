//! A subscriber's open exchanges as the subscriber sees them, and the packet-id rule of
//! issue 25: while the subscriber holds packet id X for message M (it took the PUBLISH and
//! has not completed the exchange: no PUBACK sent for QoS 1, no PUBCOMP sent for QoS 2), the
//! broker must not send X for another message (MQTT-2.3.1-2/-4: an id is reusable only once
//! its exchange completed), nor start a second QoS 2 exchange for M under another id (a
//! second delivery of M to the application at PUBREL).
//!
//! An exchange counts as closed once the client *starts* to send its PUBACK / PUBCOMP (the
//! broker may have it even if the connection then dies), and every exchange is forgotten when
//! a CONNACK says Session Present = 0: a new session may use any id (the session's loss is
//! reported apart). QoS 1 exchanges are forgotten when the broker restarts: by design the
//! broker does not record QoS 1 in flight (docs/ARCHITECTURE.md, "Queues are cursors" and
//! "Retention": after a restart the message comes again from the session's cursor under a new
//! id, at least once), though MQTT-4.4.0-1 asks for a resend under the original id. Within
//! one boot of the broker they count (the live path keeps them in memory).

use std::collections::BTreeMap;
use std::time::Duration;

/// One open exchange: the message, the QoS of its PUBLISH, where it came.
#[derive(Debug, Clone, Copy)]
struct Open {
    message: (usize, u64),
    qos: u8,
    dup: bool,
    connection: u64,
    boot: u64,
    at: Duration,
}

/// A PUBLISH as the tracker needs it.
#[derive(Debug, Clone, Copy)]
pub struct Incoming {
    pub packet_id: u16,
    pub message: (usize, u64),
    pub qos: u8,
    pub dup: bool,
    pub connection: u64,
    pub boot: u64,
    pub at: Duration,
}

#[derive(Default)]
pub struct OpenIds {
    open: BTreeMap<u16, Open>,
    /// Violations of the rule, with both PUBLISHes.
    pub violations: Vec<String>,
}

fn describe(id: u16, o: &Open) -> String {
    format!(
        "{}/{} as id {id} QoS {}{} (connection {}, boot {}, t={:?})",
        o.message.0,
        o.message.1,
        o.qos,
        if o.dup { " DUP" } else { "" },
        o.connection,
        o.boot,
        o.at
    )
}

impl OpenIds {
    /// Checks a PUBLISH against the open exchanges (every PUBLISH that came, handled or not).
    pub fn check(&mut self, p: &Incoming) {
        let new = Open {
            message: p.message,
            qos: p.qos,
            dup: p.dup,
            connection: p.connection,
            boot: p.boot,
            at: p.at,
        };
        let restored = |o: &Open| o.qos == 2 || o.boot == p.boot;
        self.open.retain(|_, o| restored(o));
        if let Some(held) = self.open.get(&p.packet_id) {
            if held.message != p.message {
                let v = format!(
                    "packet id {} reused while its exchange is open: held {}, then got {}",
                    p.packet_id,
                    describe(p.packet_id, held),
                    describe(p.packet_id, &new)
                );
                self.violations.push(v);
            }
            return;
        }
        if p.qos != 2 {
            // A QoS 1 publisher's resend is a message of its own to the broker (no received
            // set): two copies in flight are allowed.
            return;
        }
        let other = self
            .open
            .iter()
            .find(|(_, o)| o.qos == 2 && o.message == p.message);
        if let Some((&id, held)) = other {
            let v = format!(
                "a second QoS 2 exchange for a message with one open: held {}, then got {}",
                describe(id, held),
                describe(p.packet_id, &new)
            );
            self.violations.push(v);
        }
    }

    /// The subscriber took the PUBLISH: its exchange is open (kept as first seen).
    pub fn open(&mut self, p: &Incoming) {
        self.open.entry(p.packet_id).or_insert(Open {
            message: p.message,
            qos: p.qos,
            dup: p.dup,
            connection: p.connection,
            boot: p.boot,
            at: p.at,
        });
    }

    /// The subscriber starts to send the PUBACK / PUBCOMP of `packet_id`.
    pub fn close(&mut self, packet_id: u16) {
        self.open.remove(&packet_id);
    }

    /// A new session: every id is free again.
    pub fn reset(&mut self) {
        self.open.clear();
    }
}
