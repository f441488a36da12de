//! The end of a seed's run: waiting until the receivers hold what they are owed
//! ([`settle`]) and the retained value check ([`check_retained`]).

use std::sync::Arc;
use std::time::Duration;

use tern_wire::Protocol;

use super::check;
use super::client::Net;
use super::publisher::PubSpec;
use super::run::Run;

/// The retained value of `p`'s topic, read by a new clean-start client, is the last message
/// acknowledged or a later one sent (`acked..next`): never an older one, never none.
pub(super) async fn check_retained(
    net: &Arc<Net>,
    p: &PubSpec,
    acked: Option<u64>,
    next: u64,
) -> Result<(), String> {
    use super::client::{Conn, clean_connect, parse, s};
    use tern_wire::{Packet, Properties, QoS, Subscribe, SubscriptionOptions};
    let Some(last) = acked else {
        return Ok(());
    };
    let who = format!(
        "{} (retained, {:?}, QoS {})",
        p.client_id(),
        p.protocol,
        p.qos
    );
    let Some(mut c) = Conn::connect(net, clean_connect(Protocol::V5, "sim-retained")).await else {
        return Err(format!("{who}: the retained check could not connect"));
    };
    let sub = Subscribe {
        packet_id: 1,
        properties: Properties::default(),
        filters: vec![(
            s(&p.topic),
            SubscriptionOptions {
                // QoS 1: a QoS 0 delivery is dropped while the queues hold the memory cap
                // (`bounds.rs`; seed 1291 with the cap reported a false "no retained value").
                qos: QoS::AtLeastOnce,
                ..SubscriptionOptions::default()
            },
        )],
    };
    if !c.send(&Packet::Subscribe(sub)).await {
        return Err(format!("{who}: the retained check could not subscribe"));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        match c.recv(Duration::from_millis(50)).await {
            Ok(Some(Packet::Publish(m))) if m.retain => {
                return match parse(&m.payload) {
                    Some((_, n)) if n >= last && n < next => Ok(()),
                    got => Err(format!(
                        "{who}: retained value {got:?}, the last acknowledged is {last} (sent up to {})",
                        next - 1
                    )),
                };
            }
            Err(()) => break,
            _ => {}
        }
    }
    Err(format!(
        "{who}: no retained value, the last acknowledged is {last}"
    ))
}

/// Waits (5 s at most) until every receiver holds what it is owed with no QoS 2 exchange
/// open; under a retention limit, which may have removed some of it, until no exchange is
/// open and nothing arrived for 300 ms. With a share group, complete must also hold with
/// nothing arriving for [`GROUP_QUIET_MS`]: a group message one member got at QoS 1 may
/// still be on its way to another (given back by a member that left before handling it),
/// and an exchange that starts after the run stops would count as never released (campaign
/// 6, seed 565: finding 9 in docs/simulation.md).
pub(super) fn settle(run: &mut Run, pubs: &check::Pubs, subs: &check::Subs, retention: bool) {
    let receivers = check::receivers(subs);
    let expected = check::expected(pubs, &receivers);
    let groups = receivers.iter().any(|r| r.group);
    let mut last = (usize::MAX, run.now());
    let mut quiet = (usize::MAX, run.now());
    run.step_until(Duration::from_secs(5), |now| {
        if check::complete(subs, &receivers, &expected) {
            if !groups {
                return true;
            }
            let seen: usize = subs.iter().map(|(_, s)| s.lock().seen.len()).sum();
            if seen != quiet.0 {
                quiet = (seen, now);
            }
            if now - quiet.1 > Duration::from_millis(GROUP_QUIET_MS) {
                return true;
            }
        } else {
            quiet.0 = usize::MAX;
        }
        if !retention {
            return false;
        }
        let got: usize = subs.iter().map(|(_, s)| s.lock().got.len()).sum();
        let open = subs.iter().any(|(_, s)| !s.lock().received.is_empty());
        if got != last.0 || open {
            last = (got, now);
        }
        now - last.1 > Duration::from_millis(300)
    });
}

/// How long a run with a share group must stay complete, with nothing arriving, to end.
const GROUP_QUIET_MS: u64 = 100;
