use super::*;

/// A watched object: (key, name, value); a value of `None` keeps no entry.
type Obj = (&'static str, &'static str, Option<u32>);

fn row(o: &Obj) -> Option<Row<&'static str, u32>> {
    Some((o.0, o.1.to_string(), o.2))
}

fn list(t: &mut Relisted<&'static str, u32>, objs: &[Obj]) {
    t.apply(&watcher::Event::Init, row);
    for o in objs {
        t.apply(&watcher::Event::InitApply(*o), row);
    }
    t.apply(&watcher::Event::InitDone, row);
}

fn sorted(mut keys: Vec<&'static str>) -> Vec<&'static str> {
    keys.sort();
    keys
}

fn value(t: &Relisted<&'static str, u32>, key: &'static str) -> Vec<u32> {
    let mut v: Vec<u32> = t
        .get(&key)
        .into_iter()
        .flat_map(|e| e.values().copied())
        .collect();
    v.sort();
    v
}

#[test]
fn a_list_replaces_the_table_only_once_complete() {
    let mut t = Relisted::default();
    assert!(!t.listed());
    list(&mut t, &[("a", "a-1", Some(1)), ("b", "b-1", Some(2))]);
    assert!(t.listed());
    assert_eq!(sorted(t.take_changed()), ["a", "b"]);
    t.apply(&watcher::Event::Init, row);
    t.apply(&watcher::Event::InitApply(("b", "b-1", Some(2))), row);
    assert_eq!(
        value(&t, "a"),
        [1],
        "the last complete list until this one completes"
    );
    t.apply(&watcher::Event::InitApply(("c", "c-1", Some(3))), row);
    t.apply(&watcher::Event::InitDone, row);
    assert_eq!(sorted(t.take_changed()), ["a", "c"], "b is unchanged");
    assert!(value(&t, "a").is_empty());
}

#[test]
fn events_note_only_the_keys_whose_entries_changed() {
    let mut t = Relisted::default();
    list(&mut t, &[]);
    assert!(t.take_changed().is_empty(), "an empty list changes nothing");
    let steps: &[(&str, watcher::Event<Obj>, &[&str])] = &[
        (
            "a new entry",
            watcher::Event::Apply(("a", "a-1", Some(1))),
            &["a"],
        ),
        (
            "the same again",
            watcher::Event::Apply(("a", "a-1", Some(1))),
            &[],
        ),
        (
            "a new value",
            watcher::Event::Apply(("a", "a-1", Some(2))),
            &["a"],
        ),
        (
            "no longer kept",
            watcher::Event::Apply(("a", "a-1", None)),
            &["a"],
        ),
        (
            "nothing to remove",
            watcher::Event::Apply(("a", "a-1", None)),
            &[],
        ),
        (
            "a second entry",
            watcher::Event::Apply(("a", "a-2", Some(1))),
            &["a"],
        ),
        (
            "deleted",
            watcher::Event::Delete(("a", "a-2", Some(1))),
            &["a"],
        ),
        (
            "deleted again",
            watcher::Event::Delete(("a", "a-2", Some(1))),
            &[],
        ),
    ];
    for (what, ev, want) in steps {
        t.apply(ev, row);
        assert_eq!(t.take_changed(), *want, "{what}");
    }
    assert!(t.get(&"a").is_none(), "a key without entries has no row");
}

#[test]
fn a_view_notes_only_the_changes_readers_see() {
    // Readers see whether any entry is odd.
    let any_odd: View<u32> = |e| e.is_some_and(|e| e.values().any(|v| v % 2 == 1));
    let mut t = Relisted::with_view(any_odd);
    list(&mut t, &[("a", "a-1", Some(2))]);
    assert!(t.take_changed().is_empty(), "no odd entry before or after");
    let steps: &[(&str, watcher::Event<Obj>, &[&str])] = &[
        (
            "turns odd",
            watcher::Event::Apply(("a", "a-1", Some(1))),
            &["a"],
        ),
        (
            "a second odd one",
            watcher::Event::Apply(("a", "a-2", Some(3))),
            &[],
        ),
        (
            "the first goes even",
            watcher::Event::Apply(("a", "a-1", Some(4))),
            &[],
        ),
        (
            "the odd one deleted",
            watcher::Event::Delete(("a", "a-2", None)),
            &["a"],
        ),
    ];
    for (what, ev, want) in steps {
        t.apply(ev, row);
        assert_eq!(t.take_changed(), *want, "{what}");
    }
    list(&mut t, &[("a", "a-1", Some(5)), ("b", "b-1", Some(6))]);
    assert_eq!(t.take_changed(), ["a"], "b is not odd: no change to see");
}

#[test]
fn an_emptying_list_is_held_until_released() {
    let mut t = Relisted::default();
    list(&mut t, &[("a", "a-1", Some(1))]);
    t.take_changed();
    t.apply(&watcher::Event::Init, row);
    assert!(t.hold_if_emptied(), "the list in progress is empty");
    t.apply(&watcher::Event::InitDone, row);
    assert_eq!(value(&t, "a"), [1], "readers keep the table as it was");
    // A held table counts as kept: a second empty list after a new outage holds again.
    t.apply(&watcher::Event::Init, row);
    assert!(t.hold_if_emptied());
    t.apply(&watcher::Event::InitDone, row);
    assert_eq!(value(&t, "a"), [1]);
    assert_eq!(t.release(), ["a"], "the release shows the empty table");
    assert!(t.get(&"a").is_none());
    assert!(t.release().is_empty(), "released once");
    // A list that keeps something is not held.
    t.apply(&watcher::Event::Init, row);
    t.apply(&watcher::Event::InitApply(("b", "b-1", Some(2))), row);
    assert!(!t.hold_if_emptied());
    // An empty table has nothing to keep.
    let mut empty: Relisted<&'static str, u32> = Relisted::default();
    empty.apply(&watcher::Event::Init, row);
    assert!(!empty.hold_if_emptied());
}

#[test]
fn holds_are_numbered_and_each_timer_ends_only_its_own() {
    let h = Holds::default();
    // A list without an outage: trusted, whatever it holds.
    h.list_complete(|| panic!("not asked without an outage"));
    assert_eq!(h.after_list(), AfterList::Release);
    // An outage, then an emptying list: hold 1, its timer starts once.
    h.failed();
    h.list_complete(|| true);
    assert_eq!(h.after_list(), AfterList::Started(1));
    assert_eq!(h.after_list(), AfterList::Running);
    // A second list with no outage since ends it.
    h.list_complete(|| true);
    assert_eq!(h.after_list(), AfterList::Release);
    assert!(!h.expire(1), "hold 1's timer finds it already ended");
    // A new outage and emptying list: hold 2; hold 1's late timer does nothing.
    h.failed();
    h.list_complete(|| true);
    assert_eq!(h.after_list(), AfterList::Started(2));
    assert!(!h.expire(1));
    assert!(h.expire(2), "its own timer ends it");
    assert_eq!(h.after_list(), AfterList::Release);
    // An outage whose list keeps something: no hold.
    h.failed();
    h.list_complete(|| false);
    assert_eq!(h.after_list(), AfterList::Release);
}

#[test]
fn entries_compare_equal_whatever_their_order_and_one_entry_holds_one_slot() {
    let mut a = Entries::default();
    a.insert("s-2".to_string(), 2);
    a.insert("s-1".to_string(), 1);
    let mut b = Entries::default();
    b.insert("s-1".to_string(), 1);
    assert_eq!(b.0.capacity(), 1, "a key with one slice allocates one slot");
    b.insert("s-2".to_string(), 2);
    assert_eq!(a, b);
    b.insert("s-2".to_string(), 3);
    assert_ne!(a, b, "replaced");
    assert_eq!(b.get("s-2"), Some(&3));
    assert_eq!(b.values().copied().collect::<Vec<_>>(), [1, 3], "by name");
    assert!(b.remove("s-1"));
    assert!(!b.remove("s-1"), "gone already");
    assert_eq!(b.get("s-1"), None);
    assert!(!b.is_empty());
    assert!(b.remove("s-2"));
    assert!(b.is_empty());
}
