//! The protocol, model-checked: every interleaving of workers,
//! crashes, reservation expiry, key loss and late writes, up to a bound,
//! explored with `stateright` on the processor's own decision code.
//!
//! Each worker runs [`order_guard::decision::Decision`], the state machine the
//! async processor drives; the verdicts on a `COMPLETADA` marker and on a held
//! order's row are the processor's own functions too. What is modelled is the
//! world around them, each as the real component behaves:
//!
//! - **Event Grid**: three deliveries of one order id: the order `A` twice
//!   and a different order `B` reusing its id. Any delivery not answered 2xx
//!   can be delivered again, to any idle worker, any number of times.
//! - **Redis**: the guard key of the id, as the Lua scripts treat it: `SET NX`
//!   or takeover of a reservation past its owner's deadline (which may pass at
//!   any moment: a slow worker), `COMPLETADA` with the completion marker,
//!   compare-and-delete. The key can be lost at any step (TTL expiry,
//!   `FLUSHALL`, a failover losing the last write).
//! - **The database**: one row per id (the unique index), written by the
//!   store's one call: the row inserted executed, or a row of
//!   another content stored as a conflict of this delivery, or a `Received`
//!   row of this content executed (forward-only, the effect applied with
//!   it, and its announcement written to the outbox with it), or
//!   a terminal row answered a duplicate, all in one transaction.
//!   Two initial worlds: a new order, and one whose row an earlier version
//!   (two calls: accept, then execute) left `Received`.
//! - **Each worker's cache of finished orders** (`src/finished.rs`): what it
//!   remembers after answering `executed` or `duplicate`; lost when the
//!   worker crashes, evicted at any moment.
//! - **Faults**, from a budget: a worker crashes at any step (the host
//!   restarts it; its reservation stays); a call fails without effect; a call
//!   times out and still takes effect later.
//!
//! Safety is checked by stateright on every state; liveness by a pass over the
//! whole state graph: from every reachable state, once faults stop, the goal
//! (every delivery acknowledged, the order executed) is still reachable.
//! Bounds: `MODEL_WORKERS` (default 2) workers, `MODEL_FAULTS` (default 1:
//! about 250 000 states; 2 gives millions and takes minutes).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use order_guard::decision::{
    completed_verdict, completion_marker, held_elsewhere_verdict, recollection, Decision,
    GuardPolicy, OutcomeKind, Reply, Step,
};
use order_guard::order::OrderStatus;
use order_guard::store::Execution;
use stateright::{Checker, Model, Property};

/// The content of a delivery: the order, or another order reusing its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Content {
    A,
    B,
}

impl Content {
    fn fingerprint(self) -> &'static str {
        match self {
            Content::A => "fpA",
            Content::B => "fpB",
        }
    }
}

/// The deliveries Event Grid makes: the order, a copy, and a conflict.
const DELIVERIES: [Content; 3] = [Content::A, Content::A, Content::B];
const STORE_ID: &str = "db1";

/// A reservation token: the worker and a per-worker counter (mod 3: a
/// worker's new token never equals one of its tokens still in Redis).
type TokenId = (u8, u8);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// `PROCESANDO:<token>:<deadline>`; `lapsed`: the deadline has passed.
    Processing { token: TokenId, lapsed: bool },
    /// `COMPLETADA` with the marker of this content.
    Completed(Content),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Row {
    content: Content,
    status: OrderStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Delivery {
    /// Not yet answered 2xx: Event Grid will deliver it (again).
    Pending,
    /// Being processed by this worker.
    InFlight(u8),
    /// Answered 2xx with this outcome.
    Acked(OutcomeKind),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Worker {
    Idle,
    Busy {
        delivery: u8,
        decision: Decision,
        step: Step,
        token: Option<TokenId>,
    },
}

/// A call that timed out and lands later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Late {
    /// The store's one call, for this content and delivery.
    Execute(Content, u8),
    StoreConflict(u8),
    MarkCompleted(Content),
    Release(TokenId),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    deliveries: Vec<Delivery>,
    workers: Vec<Worker>,
    /// Per worker: the counter its next token takes.
    epochs: Vec<u8>,
    /// Per worker: the content its cache of finished orders remembers for the id.
    caches: Vec<Option<Content>>,
    key: Option<Key>,
    row: Option<Row>,
    /// Effects applied, per content (the position moved).
    executions: [u8; 2],
    /// Announcements written to the outbox, per content: in the
    /// execution's transaction, so one per execution, never another.
    announcements: [u8; 2],
    /// Conflicts stored in `RejectedEvents`, per delivery.
    conflicts: Vec<bool>,
    late: Vec<Late>,
    faults_left: u8,
    /// A release deleted a reservation that was not the releaser's.
    foreign_release: bool,
}

/// Known-bad variants, to show the checker finds what it must.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    None,
    /// `execute` without the `Status = 'Received'` condition.
    ExecuteWithoutReceivedCheck,
    /// Release deletes the key whoever holds it (with takeover in place).
    ReleaseWithoutOwnerCheck,
    /// `in_progress` answered 2xx.
    AcknowledgeInProgress,
    /// `COMPLETADA` written before the store commits.
    CompleteBeforeCommit,
    /// An order remembered as finished on an `in_progress` or `retry` answer.
    RememberUnfinished,
    /// `execute` of a row that holds another order's content (the
    /// fingerprint not compared).
    ExecuteOtherContent,
    /// The announcement written whenever the call finds the order done (a
    /// duplicate announced again), not only with its execution.
    AnnounceDuplicates,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Fault {
    /// The call fails and has no effect.
    Fails,
    /// The call fails (timed out) and its effect lands later.
    LandsLater,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    /// Event Grid delivers a pending delivery to an idle worker.
    Deliver { delivery: u8, worker: u8 },
    /// A worker performs its step; `fault` when it goes wrong.
    Perform { worker: u8, fault: Option<Fault> },
    /// A worker process dies (the host restarts it).
    Crash(u8),
    /// The reservation's owner passes its deadline (a slow worker).
    LeasePasses,
    /// Redis loses the key (TTL, FLUSHALL, failover).
    KeyLost,
    /// A timed-out call lands.
    LandLate(u8),
    /// A worker's cache evicts the id (size bound, TTL).
    Evict(u8),
}

struct ProtocolModel {
    workers: u8,
    faults: u8,
    bug: Bug,
}

impl ProtocolModel {
    fn new(bug: Bug) -> Self {
        ProtocolModel {
            workers: env_u8("MODEL_WORKERS", 2),
            faults: env_u8("MODEL_FAULTS", 1),
            bug,
        }
    }
}

fn env_u8(var: &str, default: u8) -> u8 {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{var} must be a small number"))
        })
        .unwrap_or(default)
}

impl World {
    fn durable(&self, delivery: usize) -> bool {
        let content = DELIVERIES[delivery];
        let executed = self.row
            == Some(Row {
                content,
                status: OrderStatus::Executed,
            });
        executed || self.conflicts[delivery]
    }

    /// The goal: every delivery acknowledged, the order executed once.
    fn settled(&self) -> bool {
        self.deliveries
            .iter()
            .all(|d| matches!(d, Delivery::Acked(_)))
            && matches!(
                self.row,
                Some(Row {
                    status: OrderStatus::Executed,
                    ..
                })
            )
    }
}

impl ProtocolModel {
    /// Redis' acquire script on the model's key.
    fn acquire(&self, w: &mut World, worker: u8) -> (Reply, Option<TokenId>) {
        let token = (worker, w.epochs[worker as usize]);
        w.epochs[worker as usize] = (token.1 + 1) % 3;
        match w.key {
            None | Some(Key::Processing { lapsed: true, .. }) => {
                let taken_over = w.key.is_some();
                w.key = Some(Key::Processing {
                    token,
                    lapsed: false,
                });
                (Reply::Acquired { taken_over }, Some(token))
            }
            Some(Key::Completed(c)) => {
                let marker = completion_marker(STORE_ID, c.fingerprint());
                let content = self.content_of(w, worker);
                let verdict =
                    completed_verdict(Some(&marker), Some(STORE_ID), content.fingerprint());
                (Reply::Completed(verdict), None)
            }
            Some(Key::Processing { .. }) => (Reply::Held, None),
        }
    }

    fn content_of(&self, w: &World, worker: u8) -> Content {
        match w.workers[worker as usize] {
            Worker::Busy { delivery, .. } => DELIVERIES[delivery as usize],
            Worker::Idle => unreachable!("only busy workers perform steps"),
        }
    }

    /// The store's one call: insert the row executed, or judge the row that
    /// holds the id: another content is a stored conflict, this content
    /// `Received` (an earlier version's accept) is executed, terminal is a
    /// duplicate. One transaction: all of it or none.
    fn execute(&self, w: &mut World, content: Content, delivery: u8) -> Execution {
        let Some(row) = w.row.as_mut() else {
            w.row = Some(Row {
                content,
                status: OrderStatus::Executed,
            });
            w.executions[content as usize] += 1;
            w.announcements[content as usize] += 1;
            return Execution::Executed;
        };
        if row.content != content && self.bug != Bug::ExecuteOtherContent {
            w.conflicts[delivery as usize] = true;
            return Execution::Conflict {
                existing_fingerprint: row.content.fingerprint().into(),
            };
        }
        let forward =
            row.status == OrderStatus::Received || self.bug == Bug::ExecuteWithoutReceivedCheck;
        if forward {
            row.status = OrderStatus::Executed;
            w.executions[content as usize] += 1;
            w.announcements[content as usize] += 1;
            Execution::Executed
        } else {
            if self.bug == Bug::AnnounceDuplicates {
                w.announcements[content as usize] += 1;
            }
            Execution::AlreadyDone
        }
    }

    fn mark_completed(w: &mut World, content: Content) {
        w.key = Some(Key::Completed(content));
    }

    /// Compare-and-delete (or, with the bug, delete).
    fn release(&self, w: &mut World, token: TokenId) {
        if let Some(Key::Processing { token: held, .. }) = w.key {
            if held == token || self.bug == Bug::ReleaseWithoutOwnerCheck {
                if held != token {
                    w.foreign_release = true;
                }
                w.key = None;
            }
        }
    }

    fn land(&self, w: &mut World, late: Late) {
        match late {
            Late::Execute(c, d) => {
                self.execute(w, c, d);
            }
            Late::StoreConflict(d) => w.conflicts[d as usize] = true,
            Late::MarkCompleted(c) => Self::mark_completed(w, c),
            Late::Release(t) => self.release(w, t),
        }
    }

    /// Which faults a step can suffer (beyond a crash).
    fn faults_of(step: Step) -> &'static [Fault] {
        match step {
            // An acquire that timed out may have set the key: a reservation
            // nobody holds (landing at once: a later landing is the same as
            // a crashed owner's reservation).
            Step::Acquire => &[Fault::Fails, Fault::LandsLater],
            Step::ReadRow => &[Fault::Fails],
            // A local lookup: nothing to fail but the process (a crash).
            Step::Recall => &[],
            Step::Execute | Step::StoreConflict | Step::MarkCompleted | Step::Release => {
                &[Fault::Fails, Fault::LandsLater]
            }
            Step::Answer(..) => &[],
        }
    }

    /// A busy worker performs its step against the world.
    fn perform(&self, w: &mut World, worker: u8, fault: Option<Fault>) {
        let Worker::Busy {
            delivery,
            decision,
            step,
            mut token,
        } = w.workers[worker as usize]
        else {
            return;
        };
        let content = DELIVERIES[delivery as usize];
        if let Step::Answer(kind, _) = step {
            if kind.proves_finished() || self.bug == Bug::RememberUnfinished {
                w.caches[worker as usize] = Some(content);
            }
            let acked = !kind.needs_redelivery()
                || (kind == OutcomeKind::InProgress && self.bug == Bug::AcknowledgeInProgress);
            w.deliveries[delivery as usize] = if acked {
                Delivery::Acked(kind)
            } else {
                Delivery::Pending
            };
            w.workers[worker as usize] = Worker::Idle;
            return;
        }
        let late = |w: &mut World, op: Late| {
            if fault == Some(Fault::LandsLater) {
                // In flight, unordered: kept sorted so one set is one state.
                w.late.push(op);
                w.late.sort();
            }
        };
        if step == Step::Execute && self.bug == Bug::CompleteBeforeCommit {
            Self::mark_completed(w, content);
        }
        let reply = match (step, fault) {
            (Step::Recall, _) => Reply::Recalled(recollection(
                w.caches[worker as usize].map(Content::fingerprint),
                content.fingerprint(),
            )),
            (Step::Acquire, None) => {
                let (reply, t) = self.acquire(w, worker);
                token = t;
                reply
            }
            (Step::Acquire, Some(f)) => {
                if f == Fault::LandsLater {
                    // The SET went through; the answer did not.
                    self.acquire(w, worker);
                }
                Reply::GuardUnavailable
            }
            (Step::ReadRow, None) => Reply::Row(held_elsewhere_verdict(
                w.row.map(|r| (r.content.fingerprint(), r.status)),
                content.fingerprint(),
            )),
            // An unreadable row is no evidence.
            (Step::ReadRow, Some(_)) => Reply::Row(held_elsewhere_verdict(None, "")),
            (Step::Execute, None) => Reply::Executed(self.execute(w, content, delivery)),
            (Step::Execute, Some(_)) => {
                late(w, Late::Execute(content, delivery));
                Reply::Failed
            }
            (Step::StoreConflict, None) => {
                w.conflicts[delivery as usize] = true;
                Reply::Stored
            }
            (Step::StoreConflict, Some(_)) => {
                late(w, Late::StoreConflict(delivery));
                Reply::Failed
            }
            (Step::MarkCompleted, f) => {
                match f {
                    None => Self::mark_completed(w, content),
                    Some(_) => late(w, Late::MarkCompleted(content)),
                }
                token = None;
                Reply::Done
            }
            (Step::Release, f) => {
                if let Some(t) = token.take() {
                    match f {
                        None => self.release(w, t),
                        Some(_) => late(w, Late::Release(t)),
                    }
                }
                Reply::Done
            }
            (Step::Answer(..), _) => unreachable!("answered above"),
        };
        let (decision, step) = decision.next(&reply);
        w.workers[worker as usize] = Worker::Busy {
            delivery,
            decision,
            step,
            token,
        };
    }
}

impl Model for ProtocolModel {
    type State = World;
    type Action = Action;

    /// A new order, and the same order with a row an earlier version (two
    /// store calls: accept, then execute) left `Received` when its worker
    /// died between them.
    fn init_states(&self) -> Vec<World> {
        let n = self.workers as usize;
        let new = World {
            deliveries: vec![Delivery::Pending; DELIVERIES.len()],
            workers: vec![Worker::Idle; n],
            epochs: vec![0; n],
            caches: vec![None; n],
            key: None,
            row: None,
            executions: [0, 0],
            announcements: [0, 0],
            conflicts: vec![false; DELIVERIES.len()],
            late: Vec::new(),
            faults_left: self.faults,
            foreign_release: false,
        };
        let upgraded = World {
            row: Some(Row {
                content: Content::A,
                status: OrderStatus::Received,
            }),
            ..new.clone()
        };
        vec![new, upgraded]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        let faulty = w.faults_left > 0;
        for (worker, state) in w.workers.iter().enumerate() {
            let worker = worker as u8;
            match state {
                Worker::Idle => {
                    for (d, delivery) in w.deliveries.iter().enumerate() {
                        if *delivery == Delivery::Pending {
                            actions.push(Action::Deliver {
                                delivery: d as u8,
                                worker,
                            });
                        }
                    }
                }
                Worker::Busy { step, .. } => {
                    actions.push(Action::Perform {
                        worker,
                        fault: None,
                    });
                    if faulty {
                        for f in Self::faults_of(*step) {
                            actions.push(Action::Perform {
                                worker,
                                fault: Some(*f),
                            });
                        }
                        actions.push(Action::Crash(worker));
                    }
                }
            }
        }
        for (worker, cache) in w.caches.iter().enumerate() {
            if cache.is_some() {
                actions.push(Action::Evict(worker as u8));
            }
        }
        if matches!(w.key, Some(Key::Processing { lapsed: false, .. })) {
            actions.push(Action::LeasePasses);
        }
        if faulty && w.key.is_some() {
            actions.push(Action::KeyLost);
        }
        for i in 0..w.late.len() {
            actions.push(Action::LandLate(i as u8));
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        match action {
            Action::Deliver { delivery, worker } => {
                let (decision, step) = Decision::start(GuardPolicy::Proceed, true);
                w.deliveries[delivery as usize] = Delivery::InFlight(worker);
                w.workers[worker as usize] = Worker::Busy {
                    delivery,
                    decision,
                    step,
                    token: None,
                };
            }
            Action::Perform { worker, fault } => {
                if fault.is_some() {
                    w.faults_left -= 1;
                }
                self.perform(&mut w, worker, fault);
            }
            Action::Crash(worker) => {
                w.faults_left -= 1;
                if let Worker::Busy { delivery, .. } = w.workers[worker as usize] {
                    w.deliveries[delivery as usize] = Delivery::Pending;
                }
                w.workers[worker as usize] = Worker::Idle;
                // A restarted process starts with an empty cache.
                w.caches[worker as usize] = None;
            }
            Action::Evict(worker) => w.caches[worker as usize] = None,
            Action::LeasePasses => {
                if let Some(Key::Processing { token, .. }) = w.key {
                    w.key = Some(Key::Processing {
                        token,
                        lapsed: true,
                    });
                }
            }
            Action::KeyLost => {
                w.faults_left -= 1;
                w.key = None;
            }
            Action::LandLate(i) => {
                let late = w.late.remove(i as usize);
                self.land(&mut w, late);
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never two executions of one order", |_, w: &World| {
                w.executions.iter().sum::<u8>() <= 1
            }),
            Property::always("never a conflicting content executed", |_, w: &World| {
                // Only the content that holds the row may have moved a position.
                [Content::A, Content::B]
                    .iter()
                    .all(|c| w.executions[*c as usize] == 0 || w.row.map(|r| r.content) == Some(*c))
            }),
            Property::always(
                "never a 2xx for an event whose effect is not durable",
                |_, w: &World| {
                    w.deliveries
                        .iter()
                        .enumerate()
                        .all(|(d, s)| !matches!(s, Delivery::Acked(_)) || w.durable(d))
                },
            ),
            Property::always(
                "every execution announced once, nothing else announced",
                |_, w: &World| w.announcements == w.executions,
            ),
            Property::always(
                "a release never deletes another worker's reservation",
                |_, w: &World| !w.foreign_release,
            ),
            Property::sometimes("every delivery can be settled", |_, w: &World| w.settled()),
        ]
    }
}

/// What one check found.
struct Report {
    states: usize,
    counterexamples: Vec<(&'static str, String)>,
    stuck: Option<String>,
    seconds: f64,
}

/// Run stateright over the model (safety), then the liveness pass.
fn check(bug: Bug) -> Report {
    let started = Instant::now();
    let model = ProtocolModel::new(bug);
    let names: Vec<&'static str> = model.properties().iter().map(|p| p.name).collect();
    let checker = model.checker().spawn_bfs().join();
    let states = checker.unique_state_count();
    let mut counterexamples = Vec::new();
    for name in names {
        if name.starts_with("every delivery") {
            continue;
        }
        if let Some(path) = checker.discovery(name) {
            counterexamples.push((name, trace(path.into_vec())));
        }
    }
    let stuck = if counterexamples.is_empty() {
        stuck_state(&ProtocolModel::new(bug))
    } else {
        None
    };
    Report {
        states,
        counterexamples,
        stuck,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// A counterexample, one line per step: the action, then the world after it.
fn trace(path: Vec<(World, Option<Action>)>) -> String {
    let mut lines = vec![format!("  start: {}", summary(&path[0].0))];
    for pair in path.windows(2) {
        if let Some(a) = pair[0].1 {
            lines.push(format!("  {a:?} → {}", summary(&pair[1].0)));
        }
    }
    lines.join("\n")
}

/// One line of a world: key, row, effects, deliveries, workers.
fn summary(w: &World) -> String {
    let workers: Vec<String> = w
        .workers
        .iter()
        .map(|wk| match wk {
            Worker::Idle => "idle".to_string(),
            Worker::Busy {
                delivery,
                step,
                token,
                ..
            } => format!("d{delivery} next {step:?} token {token:?}"),
        })
        .collect();
    format!(
        "key={:?} row={:?} executions={:?} announcements={:?} conflicts={:?} deliveries={:?} workers=[{}] caches={:?} late={:?}",
        w.key,
        w.row.map(|r| (r.content, r.status)),
        w.executions,
        w.announcements,
        w.conflicts,
        w.deliveries,
        workers.join("; "),
        w.caches,
        w.late
    )
}

/// Liveness under fair redelivery once faults stop: from every reachable
/// state, a settled state must be reachable by fault-free actions. (A finite
/// graph where the goal stays reachable from everywhere is one that fair
/// scheduling cannot avoid the goal in: stateright's `eventually` looks only
/// at terminal states, and redelivery makes cycles.) Returns a state from
/// which the goal is unreachable, with the path to it.
fn stuck_state(model: &ProtocolModel) -> Option<String> {
    // Every reachable state (with faults), and fault-free edges between them.
    let mut index: HashMap<World, usize> = HashMap::new();
    let mut states: Vec<World> = Vec::new();
    let mut parent: Vec<Option<(usize, Action)>> = Vec::new();
    let mut calm_edges: Vec<Vec<usize>> = Vec::new();
    let mut queue = VecDeque::new();
    for s in model.init_states() {
        let i = states.len();
        index.insert(s.clone(), i);
        states.push(s);
        parent.push(None);
        calm_edges.push(Vec::new());
        queue.push_back(i);
    }
    let mut actions = Vec::new();
    while let Some(i) = queue.pop_front() {
        actions.clear();
        model.actions(&states[i], &mut actions);
        for a in actions.drain(..) {
            let Some(next) = model.next_state(&states[i], a) else {
                continue;
            };
            let j = match index.get(&next) {
                Some(j) => *j,
                None => {
                    let j = states.len();
                    index.insert(next.clone(), j);
                    states.push(next);
                    parent.push(Some((i, a)));
                    calm_edges.push(Vec::new());
                    queue.push_back(j);
                    j
                }
            };
            if is_calm(a) {
                calm_edges[i].push(j);
            }
        }
    }
    // Backwards from the settled states along fault-free edges.
    let mut reverse: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
    for (i, edges) in calm_edges.iter().enumerate() {
        for &j in edges {
            reverse[j].push(i);
        }
    }
    let mut reaches = vec![false; states.len()];
    let mut queue: VecDeque<usize> = (0..states.len()).filter(|&i| states[i].settled()).collect();
    for &i in &queue {
        reaches[i] = true;
    }
    while let Some(j) = queue.pop_front() {
        for &i in &reverse[j] {
            if !reaches[i] {
                reaches[i] = true;
                queue.push_back(i);
            }
        }
    }
    let stuck = reaches.iter().position(|r| !r)?;
    let mut path = Vec::new();
    let mut at = stuck;
    while let Some((from, a)) = parent[at] {
        path.push(format!("{a:?}"));
        at = from;
    }
    path.reverse();
    Some(format!(
        "the goal is unreachable from {}\nreached by: {}",
        summary(&states[stuck]),
        path.join(" → ")
    ))
}

/// Actions that still happen once faults stop.
fn is_calm(a: Action) -> bool {
    match a {
        Action::Deliver { .. } | Action::LeasePasses | Action::LandLate(_) | Action::Evict(_) => {
            true
        }
        Action::Perform { fault, .. } => fault.is_none(),
        Action::Crash(_) | Action::KeyLost => false,
    }
}

#[test]
fn the_protocol_is_safe_and_live_in_every_interleaving() {
    let r = check(Bug::None);
    println!(
        "model: {} states explored in {:.1} s (workers={}, faults={}, deliveries={})",
        r.states,
        r.seconds,
        env_u8("MODEL_WORKERS", 2),
        env_u8("MODEL_FAULTS", 1),
        DELIVERIES.len()
    );
    for (name, path) in &r.counterexamples {
        println!("counterexample to {name:?}:\n{path}");
    }
    assert!(
        r.counterexamples.is_empty(),
        "safety properties broken: {:?}",
        r.counterexamples.iter().map(|c| c.0).collect::<Vec<_>>()
    );
    if let Some(stuck) = &r.stuck {
        panic!("liveness broken: {stuck}");
    }
}

/// A seeded bug must be found, with its trace.
fn finds(bug: Bug, property: &str) {
    let r = check(bug);
    let found = r.counterexamples.iter().find(|(name, _)| *name == property);
    match found {
        Some((_, path)) => println!(
            "{bug:?}: found \"{property}\" broken ({} states, {:.1} s), trace:\n{path}",
            r.states, r.seconds
        ),
        None => panic!(
            "{bug:?} was not caught: no counterexample to \"{property}\" in {} states (found: {:?})",
            r.states,
            r.counterexamples.iter().map(|c| c.0).collect::<Vec<_>>()
        ),
    }
}

#[test]
fn execute_without_the_received_condition_is_caught() {
    finds(
        Bug::ExecuteWithoutReceivedCheck,
        "never two executions of one order",
    );
}

#[test]
fn release_without_the_owner_check_is_caught() {
    finds(
        Bug::ReleaseWithoutOwnerCheck,
        "a release never deletes another worker's reservation",
    );
}

#[test]
fn acknowledging_in_progress_is_caught() {
    finds(
        Bug::AcknowledgeInProgress,
        "never a 2xx for an event whose effect is not durable",
    );
}

#[test]
fn completing_before_the_commit_is_caught() {
    finds(
        Bug::CompleteBeforeCommit,
        "never a 2xx for an event whose effect is not durable",
    );
}

#[test]
fn remembering_an_unfinished_order_is_caught() {
    finds(
        Bug::RememberUnfinished,
        "never a 2xx for an event whose effect is not durable",
    );
}

#[test]
fn executing_a_row_that_holds_another_order_is_caught() {
    finds(
        Bug::ExecuteOtherContent,
        "never a conflicting content executed",
    );
}

#[test]
fn announcing_a_duplicate_is_caught() {
    finds(
        Bug::AnnounceDuplicates,
        "every execution announced once, nothing else announced",
    );
}
