//! Shares of one allowance (tower-allowance's feature `shares`): a high request jumps the
//! reservations already made by exactly its increment, and the classes' virtual times are
//! kept with the state; weighted classes share the admissions by weight.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tower_allowance::{
    rule::{Admission, AdmitRequest, EventKind, Op, Reply, ShareRequest, SHARE_SCALE},
    shares::{Class, Share},
    store::Store,
    AcquireOptions,
};

use crate::harness::{allowance, per_second, MS};

fn share(
    direct_reply: Result<Reply, tower_allowance::store::StoreError>,
) -> tower_allowance::rule::ShareReply {
    match direct_reply {
        Ok(Reply::Share(reply)) => reply,
        other => panic!("a share answered {other:?}"),
    }
}

pub(crate) async fn a_high_request_jumps_the_queue_by_one_slot<S: Store>(store: S) {
    let (_a, direct) = allowance(per_second(10, 1), store);
    // The burst, then three slots reserved in order: 100, 200, 300 ms.
    assert_eq!(
        direct.admit(AdmitRequest::first()).await,
        Admission::Admitted
    );
    for want in [100, 200, 300] {
        match direct.admit(AdmitRequest::first()).await {
            Admission::Reserved { wait, .. } => assert_eq!(wait, want * MS),
            other => panic!("reserved, got {other:?}"),
        }
    }
    // A high request takes the slot after the one being served (100 ms), and every pending
    // slot moves two intervals later (one for it, one to keep the bucket's bound): an event
    // of that shift.
    let reply = share(
        direct
            .apply(Op::Share(
                ShareRequest::new(AdmitRequest::first(), 1, 1).high(true),
            ))
            .await,
    );
    match reply.admission {
        Admission::Reserved { wait, .. } => assert_eq!(wait, 100 * MS),
        other => panic!("reserved, got {other:?}"),
    }
    let event = reply.event.expect("the schedule moved");
    match event.kind() {
        EventKind::Cooldown { shift, .. } => assert_eq!(shift[0], 200_000),
        other => panic!("a shift, got {other:?}"),
    }
    assert_eq!(
        reply.classes.finish(1),
        SHARE_SCALE,
        "its class finishes one step on"
    );
    // The plain schedule goes on after the moved slots: 600 ms.
    match direct.admit(AdmitRequest::first()).await {
        Admission::Reserved { wait, .. } => assert_eq!(wait, 600 * MS),
        other => panic!("reserved, got {other:?}"),
    }
    // A class without priority queues at the end, and its virtual start is the one asked.
    let reply = share(
        direct
            .apply(Op::Share(
                ShareRequest::new(AdmitRequest::first(), 2, 2).start(7 * SHARE_SCALE),
            ))
            .await,
    );
    match reply.admission {
        Admission::Reserved { wait, .. } => assert_eq!(wait, 700 * MS),
        other => panic!("reserved, got {other:?}"),
    }
    assert_eq!(reply.classes.finish(2), 7 * SHARE_SCALE + SHARE_SCALE / 2);
    assert_eq!(reply.classes.vtime(), 7 * SHARE_SCALE);
    // The jump moved its class on, not the virtual time.
    assert_eq!(reply.classes.finish(1), SHARE_SCALE);
}

/// A share carrying the virtual time its process admitted up to on its own (a lease's
/// admissions, which the store never sees) moves the store's up to it first: a high class
/// that jumped its lead's worth may jump again once the others' admissions have caught up.
pub(crate) async fn a_share_moves_the_virtual_time_up_to_what_its_process_saw<S: Store>(store: S) {
    let (_a, direct) = allowance(per_second(10, 1), store);
    let high = || {
        ShareRequest::new(
            AdmitRequest::first().max_wait(Duration::from_secs(60)),
            1,
            1,
        )
        .high(true)
    };
    // The burst, then a backlog of 20 reserved slots, to jump.
    for _ in 0..21 {
        direct.admit(AdmitRequest::first()).await;
    }
    // Eight jumps: the class's lead (8 of its admissions ahead of the virtual time).
    for _ in 0..8 {
        let reply = share(direct.apply(Op::Share(high())).await);
        assert!(reply.event.is_some(), "a jump: {reply:?}");
    }
    let reply = share(direct.apply(Op::Share(high())).await);
    assert!(
        reply.event.is_none(),
        "beyond its lead it queues: {reply:?}"
    );
    assert_eq!(reply.classes.vtime(), 8 * SHARE_SCALE);
    // Its process admitted the others' starts up to 12 steps on (a lease's): it jumps again.
    let reply = share(direct.apply(Op::Share(high().seen(12 * SHARE_SCALE))).await);
    assert!(reply.event.is_some(), "a jump again: {reply:?}");
    assert_eq!(reply.classes.vtime(), 12 * SHARE_SCALE);
    // An older one changes nothing (the later of the two).
    let reply = share(direct.apply(Op::Share(high().seen(SHARE_SCALE))).await);
    assert_eq!(reply.classes.vtime(), 12 * SHARE_SCALE);
}

pub(crate) async fn classes_share_by_weight<S: Store>(store: S) {
    let config = per_second(10, 1)
        .with_class("a", Share::weight(2).expect("weight"))
        .and_then(|c| c.with_class("b", Share::weight(1).expect("weight")))
        .expect("classes");
    let (a, _) = allowance(config, store);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for name in ["a", "a", "a", "b", "b", "b"] {
        let (a, order) = (a.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let options = AcquireOptions::new().class(&Class::new(name));
                a.acquire_with(options).await.expect("admitted");
                order.lock().expect("lock").push(name);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().expect("lock").clone();
    assert_eq!(order.len(), 24);
    // While both wait (the first 18): a twice as often as b, to one admission.
    let a_count = order[..18].iter().filter(|n| **n == "a").count();
    assert!((11..=13).contains(&a_count), "{order:?}");
    tokio::time::sleep(Duration::ZERO).await;
}
