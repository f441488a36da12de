use super::*;
use crate::error::{ShareNameError, TopicFilterError};

type Trie = SubscriptionTrie<u32, &'static str>;

fn matched(trie: &Trie, topic: &str) -> Vec<(u32, &'static str)> {
    let mut out = Vec::new();
    trie.for_each_subscription(topic, |k, v| out.push((*k, *v)));
    out.sort();
    out
}

fn keys(trie: &Trie, topic: &str) -> Vec<u32> {
    matched(trie, topic).into_iter().map(|(k, _)| k).collect()
}

fn trie_with(filters: &[&'static str]) -> Trie {
    let mut trie = Trie::new();
    for (i, f) in filters.iter().enumerate() {
        trie.subscribe(f, i as u32, f).unwrap();
    }
    trie
}

#[test]
fn exact_filter_matches_only_its_topic() {
    let trie = trie_with(&["a/b", "a", "a/b/c"]);
    assert_eq!(keys(&trie, "a/b"), vec![0]);
    assert_eq!(keys(&trie, "a"), vec![1]);
    assert_eq!(keys(&trie, "a/b/c"), vec![2]);
    assert!(keys(&trie, "a/c").is_empty());
    assert!(keys(&trie, "b").is_empty());
}

#[test]
fn plus_matches_exactly_one_level_mqtt_4_7_1_3() {
    let trie = trie_with(&["sport/tennis/+", "+", "+/+", "/+"]);
    assert_eq!(keys(&trie, "sport/tennis/player1"), vec![0]);
    assert!(keys(&trie, "sport/tennis/player1/ranking").is_empty());
    assert_eq!(keys(&trie, "sport/tennis"), vec![2]);
    assert_eq!(keys(&trie, "sport"), vec![1]);
    // "/finance" has two levels: "" and "finance".
    assert_eq!(keys(&trie, "/finance"), vec![2, 3]);
}

#[test]
fn plus_matches_empty_levels() {
    let trie = trie_with(&["a/+/b", "a/+", "+/b"]);
    assert_eq!(keys(&trie, "a//b"), vec![0]);
    assert_eq!(keys(&trie, "a/"), vec![1]);
    assert_eq!(keys(&trie, "/b"), vec![2]);
}

#[test]
fn hash_matches_parent_and_all_children_mqtt_4_7_1_2() {
    let trie = trie_with(&["sport/#", "#", "sport/tennis/#"]);
    assert_eq!(keys(&trie, "sport"), vec![0, 1]);
    assert_eq!(keys(&trie, "sport/"), vec![0, 1]);
    assert_eq!(keys(&trie, "sport/tennis"), vec![0, 1, 2]);
    assert_eq!(keys(&trie, "sport/tennis/player1/ranking"), vec![0, 1, 2]);
    assert_eq!(keys(&trie, "sports"), vec![1]);
    assert_eq!(keys(&trie, "/"), vec![1]);
}

#[test]
fn plus_then_hash() {
    let trie = trie_with(&["+/#", "a/+/#"]);
    assert_eq!(keys(&trie, "a"), vec![0]);
    assert_eq!(keys(&trie, "a/b"), vec![0, 1]);
    assert_eq!(keys(&trie, "a/b/c/d"), vec![0, 1]);
    assert_eq!(keys(&trie, "x"), vec![0]);
}

#[test]
fn empty_levels_are_distinct_mqtt_4_7_3_4() {
    let trie = trie_with(&["a/b", "a//b", "/a", "a/", "a"]);
    assert_eq!(keys(&trie, "a/b"), vec![0]);
    assert_eq!(keys(&trie, "a//b"), vec![1]);
    assert_eq!(keys(&trie, "/a"), vec![2]);
    assert_eq!(keys(&trie, "a/"), vec![3]);
    assert_eq!(keys(&trie, "a"), vec![4]);
    assert!(keys(&trie, "A").is_empty());
}

#[test]
fn dollar_topics_not_matched_by_leading_wildcards_mqtt_4_7_2_1() {
    let mut trie = trie_with(&["#", "+/monitor/Clients", "$SYS/#", "$SYS/monitor/+", "+"]);
    assert_eq!(keys(&trie, "$SYS/monitor/Clients"), vec![2, 3]);
    assert_eq!(keys(&trie, "$SYS"), vec![2]);
    assert!(keys(&trie, "$other").is_empty());
    // The rule covers the first level only.
    assert_eq!(keys(&trie, "a/$x"), vec![0]);
    assert_eq!(keys(&trie, "x/monitor/Clients"), vec![0, 1]);
    // ...and shared subscriptions too.
    trie.subscribe_shared("g", "#", 9, "shared").unwrap();
    let mut groups = 0;
    trie.for_each_shared_group("$SYS/x", |_| groups += 1);
    assert_eq!(groups, 0);
    trie.for_each_shared_group("x", |_| groups += 1);
    assert_eq!(groups, 1);
}

#[test]
fn invalid_filters_are_refused_mqtt_4_7_1_2_and_4_7_1_3_and_4_7_3_1() {
    let mut trie = Trie::new();
    assert_eq!(
        trie.subscribe("a/#/b", 1, ""),
        Err(TopicFilterError::MultiLevelWildcard { offset: 2 }.into())
    );
    assert_eq!(
        trie.subscribe("a+", 1, ""),
        Err(TopicFilterError::SingleLevelWildcard { offset: 1 }.into())
    );
    assert_eq!(
        trie.subscribe("", 1, ""),
        Err(TopicFilterError::Empty.into())
    );
    assert_eq!(
        trie.subscribe_shared("", "a", 1, ""),
        Err(ShareNameError::Empty.into())
    );
    assert_eq!(
        trie.subscribe_shared("g", "", 1, ""),
        Err(TopicFilterError::Empty.into())
    );
    assert_eq!(trie.len(), 0);
}

#[test]
fn level_limit_bounds_trie_depth() {
    let mut trie = Trie::with_limits(3, DEFAULT_MAX_SUBSCRIPTIONS);
    assert!(trie.subscribe("a/b/c", 1, "").is_ok());
    assert_eq!(
        trie.subscribe("a/b/c/d", 1, ""),
        Err(SubscribeError::TooManyLevels {
            levels: 4,
            max_levels: 3
        })
    );
    // A very deep topic is still matched (only as deep as the trie goes).
    let deep = "a/".repeat(30_000) + "a";
    assert!(keys(&trie, &deep).is_empty());
    assert_eq!(trie.unsubscribe(&deep, &1), None);
}

#[test]
fn subscribe_replaces_and_returns_old_value() {
    let mut trie = Trie::new();
    assert_eq!(trie.subscribe("a/+", 1, "qos0"), Ok(None));
    assert_eq!(trie.subscribe("a/+", 1, "qos1"), Ok(Some("qos0")));
    assert_eq!(trie.len(), 1);
    assert_eq!(trie.get("a/+", &1), Some(&"qos1"));
    assert_eq!(matched(&trie, "a/x"), vec![(1, "qos1")]);
    // Same key on another filter is a separate subscription.
    assert_eq!(trie.subscribe("a/#", 1, "qos2"), Ok(None));
    assert_eq!(trie.len(), 2);
    assert_eq!(matched(&trie, "a/x"), vec![(1, "qos1"), (1, "qos2")]);
}

#[test]
fn unsubscribe_returns_value_and_prunes_nodes() {
    let mut trie = Trie::new();
    assert_eq!(trie.node_count(), 1);
    trie.subscribe("a/b/c", 1, "x").unwrap();
    trie.subscribe("a/+/#", 2, "y").unwrap();
    trie.subscribe("a/b", 3, "z").unwrap();
    trie.subscribe_shared("g", "a/b/c", 4, "s").unwrap();
    let before = trie.node_count();
    assert_eq!(trie.unsubscribe("a/b/c", &9), None);
    assert_eq!(trie.unsubscribe("a/b/d", &1), None);
    assert_eq!(trie.unsubscribe("a/#/b", &1), None);
    assert_eq!(trie.node_count(), before);
    assert_eq!(trie.unsubscribe("a/b/c", &1), Some("x"));
    // a/b/c still holds the share group.
    assert_eq!(trie.node_count(), before);
    assert_eq!(trie.unsubscribe_shared("g", "a/b/c", &4), Some("s"));
    assert_eq!(trie.node_count(), before - 1);
    assert_eq!(trie.unsubscribe("a/+/#", &2), Some("y"));
    assert_eq!(trie.unsubscribe("a/b", &3), Some("z"));
    assert_eq!(trie.node_count(), 1);
    assert!(trie.is_empty());
    assert_eq!(trie.unsubscribe("a/b", &3), None);
}

#[test]
fn churn_does_not_grow_the_trie() {
    let mut trie: SubscriptionTrie<u32, u32> = SubscriptionTrie::new();
    for round in 0..3 {
        for i in 0..200u32 {
            let filter = format!("site/{}/device/{}/+", i % 7, i);
            trie.subscribe(&filter, i, round).unwrap();
            trie.subscribe_shared("g", &filter, i, round).unwrap();
        }
        for i in 0..200u32 {
            let filter = format!("site/{}/device/{}/+", i % 7, i);
            assert_eq!(trie.unsubscribe(&filter, &i), Some(round));
            assert_eq!(trie.unsubscribe_shared("g", &filter, &i), Some(round));
        }
        assert_eq!(trie.node_count(), 1);
        assert_eq!(trie.len(), 0);
    }
}

#[test]
fn wide_nodes_switch_to_hash_maps_and_back() {
    let mut trie: SubscriptionTrie<u32, u32> = SubscriptionTrie::new();
    for i in 0..100u32 {
        trie.subscribe(&format!("w/{i}"), i, i).unwrap();
        trie.subscribe("w/#", i, i).unwrap();
    }
    for i in 0..100u32 {
        let mut seen = Vec::new();
        trie.for_each_subscription(&format!("w/{i}"), |k, _| seen.push(*k));
        assert_eq!(seen.len(), 101);
    }
    for i in 0..100u32 {
        assert_eq!(trie.unsubscribe(&format!("w/{i}"), &i), Some(i));
        assert_eq!(trie.unsubscribe("w/#", &i), Some(i));
    }
    assert_eq!(trie.node_count(), 1);
}

#[test]
fn shared_groups_are_visited_once_per_matching_filter_mqtt_4_8_2() {
    let mut trie = Trie::new();
    trie.subscribe_shared("g1", "a/+", 1, "a").unwrap();
    trie.subscribe_shared("g1", "a/+", 2, "b").unwrap();
    trie.subscribe_shared("g2", "a/+", 3, "c").unwrap();
    trie.subscribe_shared("g1", "a/#", 4, "d").unwrap();
    assert_eq!(trie.subscribe_shared("g1", "a/+", 2, "b2"), Ok(Some("b")));
    assert_eq!(trie.len(), 4);
    let mut groups = Vec::new();
    trie.for_each_match("a/x", |m| match m {
        Match::Shared(g) => groups.push((
            g.name().to_string(),
            g.filter().to_string(),
            g.members()
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect::<Vec<_>>(),
        )),
        Match::Subscription { .. } => panic!("no normal subscription"),
    });
    groups.sort();
    assert_eq!(
        groups,
        vec![
            ("g1".into(), "a/#".into(), vec![(4, "d")]),
            ("g1".into(), "a/+".into(), vec![(1, "a"), (2, "b2")]),
            ("g2".into(), "a/+".into(), vec![(3, "c")]),
        ]
    );
    assert!(trie.shared_group("g1", "a/+").is_some());
    assert!(trie.shared_group("g3", "a/+").is_none());
    assert_eq!(trie.unsubscribe_shared("g2", "a/+", &1), None);
    assert_eq!(trie.unsubscribe_shared("g2", "a/+", &3), Some("c"));
    assert!(trie.shared_group("g2", "a/+").is_none());
}

#[test]
fn shared_round_robin_through_the_trie() {
    let mut trie = Trie::new();
    for k in 1..=3 {
        trie.subscribe_shared("g", "jobs/#", k, "").unwrap();
    }
    let mut picks = Vec::new();
    for _ in 0..6 {
        trie.for_each_shared_group("jobs/1", |g| {
            picks.push(*g.next_member_where(|k, _| *k != 2).unwrap().0);
        });
    }
    assert_eq!(picks, vec![1, 3, 1, 3, 1, 3]);
}

#[test]
fn remove_key_drops_everything_of_a_session() {
    let mut trie = Trie::new();
    trie.subscribe("a/b", 1, "").unwrap();
    trie.subscribe("a/+", 1, "").unwrap();
    trie.subscribe("#", 1, "").unwrap();
    trie.subscribe("a/b", 2, "").unwrap();
    trie.subscribe_shared("g", "a/b", 1, "").unwrap();
    trie.subscribe_shared("g", "x/y", 1, "").unwrap();
    assert_eq!(trie.remove_key(&1), 5);
    assert_eq!(trie.len(), 1);
    assert_eq!(keys(&trie, "a/b"), vec![2]);
    assert!(trie.shared_group("g", "a/b").is_none());
    assert_eq!(trie.remove_key(&1), 0);
    assert_eq!(trie.remove_key(&2), 1);
    assert_eq!(trie.node_count(), 1);
}

#[test]
fn share_prefix_is_a_literal_level_in_plain_filters() {
    // A plain subscription on a `$share/...` topic name is just a `$` topic.
    let trie = trie_with(&["$share/g/a", "#"]);
    assert_eq!(keys(&trie, "$share/g/a"), vec![0]);
}

#[test]
fn trie_can_be_shared_across_threads_for_matching() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SubscriptionTrie<u64, u8>>();
    assert_send_sync::<SubscriptionTrie<std::sync::Arc<str>, u8>>();
}

#[test]
fn arc_str_keys_work() {
    use std::sync::Arc;
    let mut trie: SubscriptionTrie<Arc<str>, u8> = SubscriptionTrie::new();
    let session: Arc<str> = Arc::from("client-1");
    trie.subscribe("a/#", session.clone(), 1).unwrap();
    let mut seen = Vec::new();
    trie.for_each_subscription("a/b", |k, v| seen.push((k.clone(), *v)));
    assert_eq!(seen, vec![(session.clone(), 1)]);
    assert_eq!(trie.unsubscribe("a/#", &session), Some(1));
}

#[test]
fn subscription_limit_allows_replacement_but_not_growth() {
    let mut trie = Trie::with_limits(DEFAULT_MAX_FILTER_LEVELS, 2);
    trie.subscribe("a", 1, "x").unwrap();
    trie.subscribe_shared("g", "b", 2, "y").unwrap();
    let quota = Err(SubscribeError::TooManySubscriptions {
        max_subscriptions: 2,
    });
    assert_eq!(trie.subscribe("a", 3, "z"), quota);
    assert_eq!(trie.subscribe("c", 1, "z"), quota);
    assert_eq!(trie.subscribe_shared("g", "b", 3, "z"), quota);
    assert_eq!(trie.subscribe_shared("h", "b", 2, "z"), quota);
    assert_eq!(trie.subscribe("a", 1, "x2"), Ok(Some("x")));
    assert_eq!(trie.subscribe_shared("g", "b", 2, "y2"), Ok(Some("y")));
    assert_eq!(trie.unsubscribe("a", &1), Some("x2"));
    assert_eq!(trie.subscribe("c", 1, "z"), Ok(None));
    assert_eq!(trie.len(), 2);
    // A refused subscribe leaves no empty node behind.
    assert_eq!(trie.node_count(), 3);
}
