//! Property test: the trie agrees with a naive model (a list of subscriptions checked one by
//! one with `filter_matches`) over random filters, topics and subscribe/unsubscribe
//! sequences, including shared groups, replacement values and pruning.

use proptest::prelude::*;
use tern_topic::{Match, SubscriptionTrie, filter_matches, validate_topic_filter};

#[derive(Debug, Clone)]
enum Op {
    Subscribe(String, u8, u32),
    Unsubscribe(String, u8),
    SubscribeShared(String, String, u8, u32),
    UnsubscribeShared(String, String, u8),
    RemoveKey(u8),
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    group: Option<String>,
    filter: String,
    key: u8,
    value: u32,
}

fn filter() -> impl Strategy<Value = String> {
    let level = prop_oneof![
        Just("a"),
        Just("b"),
        Just(""),
        Just("$x"),
        Just("+"),
        Just("+")
    ];
    (prop::collection::vec(level, 0..4), any::<bool>()).prop_map(|(levels, hash)| {
        let mut levels: Vec<&str> = levels;
        if hash || levels.is_empty() {
            levels.push("#");
        }
        match levels.join("/") {
            // A lone empty level is the empty filter, invalid [MQTT-4.7.3-1].
            empty if empty.is_empty() => "+".to_string(),
            joined => joined,
        }
    })
}

fn topic() -> impl Strategy<Value = String> {
    let level = prop_oneof![Just("a"), Just("b"), Just(""), Just("$x"), Just("c")];
    prop::collection::vec(level, 1..5).prop_map(|levels| levels.join("/"))
}

fn group() -> impl Strategy<Value = String> {
    prop_oneof![Just("g1".to_string()), Just("g2".to_string())]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..4;
    prop_oneof![
        4 => (filter(), key.clone(), any::<u32>()).prop_map(|(f, k, v)| Op::Subscribe(f, k, v)),
        2 => (filter(), key.clone()).prop_map(|(f, k)| Op::Unsubscribe(f, k)),
        2 => (group(), filter(), key.clone(), any::<u32>())
            .prop_map(|(g, f, k, v)| Op::SubscribeShared(g, f, k, v)),
        1 => (group(), filter(), key.clone()).prop_map(|(g, f, k)| Op::UnsubscribeShared(g, f, k)),
        1 => key.prop_map(Op::RemoveKey),
    ]
}

/// Applies `op` to the model, returning what the trie should return.
fn apply_model(model: &mut Vec<Entry>, op: &Op) -> Option<u32> {
    let find = |model: &Vec<Entry>, group: Option<&str>, filter: &str, key: u8| {
        model
            .iter()
            .position(|e| e.group.as_deref() == group && e.filter == filter && e.key == key)
    };
    match op {
        Op::Subscribe(f, k, v) | Op::SubscribeShared(_, f, k, v) => {
            let group = match op {
                Op::SubscribeShared(g, ..) => Some(g.clone()),
                _ => None,
            };
            match find(model, group.as_deref(), f, *k) {
                Some(i) => Some(std::mem::replace(&mut model[i].value, *v)),
                None => {
                    model.push(Entry {
                        group,
                        filter: f.clone(),
                        key: *k,
                        value: *v,
                    });
                    None
                }
            }
        }
        Op::Unsubscribe(f, k) => find(model, None, f, *k).map(|i| model.remove(i).value),
        Op::UnsubscribeShared(g, f, k) => {
            find(model, Some(g), f, *k).map(|i| model.remove(i).value)
        }
        Op::RemoveKey(k) => {
            let before = model.len();
            model.retain(|e| e.key != *k);
            Some((before - model.len()) as u32)
        }
    }
}

fn apply_trie(trie: &mut SubscriptionTrie<u8, u32>, op: &Op) -> Option<u32> {
    match op {
        Op::Subscribe(f, k, v) => trie.subscribe(f, *k, *v).unwrap(),
        Op::Unsubscribe(f, k) => trie.unsubscribe(f, k),
        Op::SubscribeShared(g, f, k, v) => trie.subscribe_shared(g, f, *k, *v).unwrap(),
        Op::UnsubscribeShared(g, f, k) => trie.unsubscribe_shared(g, f, k),
        Op::RemoveKey(k) => Some(trie.remove_key(k) as u32),
    }
}

type Groups = Vec<(String, String, Vec<(u8, u32)>)>;

fn trie_matches(trie: &SubscriptionTrie<u8, u32>, topic: &str) -> (Vec<(u8, u32)>, Groups) {
    let mut subs = Vec::new();
    let mut groups = Vec::new();
    trie.for_each_match(topic, |m| match m {
        Match::Subscription { key, value } => subs.push((*key, *value)),
        Match::Shared(g) => groups.push((
            g.name().to_string(),
            g.filter().to_string(),
            g.members().to_vec(),
        )),
    });
    subs.sort();
    groups.sort();
    (subs, groups)
}

fn model_matches(model: &[Entry], topic: &str) -> (Vec<(u8, u32)>, Groups) {
    let mut subs = Vec::new();
    let mut groups: Groups = Vec::new();
    for e in model.iter().filter(|e| filter_matches(&e.filter, topic)) {
        match &e.group {
            None => subs.push((e.key, e.value)),
            Some(g) => match groups.iter_mut().find(|(n, f, _)| n == g && *f == e.filter) {
                // Model order is subscription order, as in the group.
                Some((_, _, members)) => members.push((e.key, e.value)),
                None => groups.push((g.clone(), e.filter.clone(), vec![(e.key, e.value)])),
            },
        }
    }
    subs.sort();
    groups.sort();
    (subs, groups)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn generated_filters_are_valid(f in filter()) {
        prop_assert_eq!(validate_topic_filter(&f), Ok(()));
    }

    #[test]
    fn trie_agrees_with_reference_matcher(
        ops in prop::collection::vec(op(), 1..40),
        topics in prop::collection::vec(topic(), 1..12),
    ) {
        let mut trie = SubscriptionTrie::new();
        let mut model = Vec::new();
        for op in &ops {
            let expected = apply_model(&mut model, op);
            let got = apply_trie(&mut trie, op);
            prop_assert_eq!(got, expected, "op {:?}", op);
            prop_assert_eq!(trie.len(), model.len());
            // After every step, not only at the end: a stale node or group shows at once.
            for topic in &topics {
                prop_assert_eq!(
                    trie_matches(&trie, topic),
                    model_matches(&model, topic),
                    "topic {:?} after op {:?}", topic, op
                );
            }
        }
        for topic in topics.iter().map(String::as_str).chain(["$x", "a", "a/b", "/", "$x/a"]) {
            prop_assert_eq!(trie_matches(&trie, topic), model_matches(&model, topic), "topic {:?}", topic);
        }
        // Unsubscribing everything leaves only the root: nothing leaks.
        for e in &model {
            let removed = match &e.group {
                None => trie.unsubscribe(&e.filter, &e.key),
                Some(g) => trie.unsubscribe_shared(g, &e.filter, &e.key),
            };
            prop_assert_eq!(removed, Some(e.value));
        }
        prop_assert_eq!(trie.len(), 0);
        prop_assert_eq!(trie.node_count(), 1);
    }
}
