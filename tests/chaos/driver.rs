//! The driver: Event Grid + the Functions host.

use super::*;

/// Answers seen, for the audit and the summary.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) attempts: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) failed_500: AtomicU64,
    pub(crate) connection_errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) undelivered: AtomicU64,
    /// Events dead-lettered after a short budget.
    pub(crate) dead_lettered: AtomicU64,
    /// `executed` answers per order: more than one would be a double execution.
    pub(crate) executed_answers: Mutex<HashMap<usize, u32>>,
    /// When each `executed` answer came back: the recovery after each store
    /// fault is read from these.
    pub(crate) executed_at: Mutex<Vec<Instant>>,
    /// Acknowledged conflict / poison deliveries per event.
    pub(crate) conflict_acks: Mutex<HashMap<usize, i64>>,
    pub(crate) poison_acks: Mutex<HashMap<usize, i64>>,
    pub(crate) outcomes: Mutex<BTreeMap<String, u64>>,
    /// Acknowledged `duplicate` answers: which order, when.
    pub(crate) duplicate_acks: Mutex<Vec<(usize, Instant)>>,
    /// Per-event answers that say the guard was unavailable (the store
    /// decided alone), and when.
    pub(crate) guard_unavailable: AtomicU64,
    pub(crate) guard_unavailable_at: Mutex<Vec<Instant>>,
    /// For deliveries whose handler died mid-invocation and whose retries
    /// then met the orphaned reservation (`in_progress`): how long from the
    /// death to the 2xx (the takeover at the owner's deadline ends the wait).
    pub(crate) orphan_waits: Mutex<Vec<Duration>>,
}

pub(crate) struct Driver {
    pub(crate) client: hyper::Client<hyper::client::HttpConnector>,
    pub(crate) ports: Vec<u16>,
    pub(crate) kill_txs: Vec<mpsc::UnboundedSender<KillRequest>>,
    pub(crate) acks: Vec<watch::Sender<bool>>,
    pub(crate) in_flight: Semaphore,
    /// Per order: its own deliveries (not waiting on its ack) still running.
    pub(crate) unsettled: Vec<AtomicU64>,
    pub(crate) tally: Tally,
    pub(crate) problems: Problems,
    pub(crate) stats: Arc<FleetStats>,
    pub(crate) poison: Vec<PoisonEvent>,
    /// Where exhausted short-budget deliveries are dead-lettered.
    pub(crate) dead_letters: Arc<order_guard::deadletter::Container>,
}

pub(crate) fn backoff(attempt: u32, rng: &mut StdRng) -> Duration {
    let step = EG_SCHEDULE_SECONDS[(attempt as usize).min(EG_SCHEDULE_SECONDS.len() - 1)];
    let base = Duration::from_millis(step * 1000 / BACKOFF_COMPRESSION).min(BACKOFF_CAP);
    base.mul_f64(rng.gen_range(0.8..1.2))
}

impl Driver {
    /// Deliver until the host would answer Event Grid with a 2xx (bounded),
    /// then count this delivery out of its orders' unsettled ones.
    pub(crate) async fn deliver(self: Arc<Self>, d: Delivery, seed: u64, started: Instant) {
        Arc::clone(&self).attempts(&d, seed, started).await;
        if d.after_ack_of.is_none() {
            for expect in &d.expects {
                if let Expect::Order(i) = expect {
                    // The last of an order's own deliveries is done, acknowledged
                    // or given up (the audit says so): its late copies and
                    // conflicting twins may go; they must not wait forever.
                    if self.unsettled[*i].fetch_sub(1, Ordering::AcqRel) == 1 {
                        self.acks[*i].send_replace(true);
                    }
                }
            }
        }
    }

    pub(crate) async fn attempts(self: Arc<Self>, d: &Delivery, seed: u64, started: Instant) {
        let d = d.clone();
        let mut rng = StdRng::seed_from_u64(seed);
        if let Some(order) = d.after_ack_of {
            let mut rx = self.acks[order].subscribe();
            // Until the order is acknowledged (or every one of its own
            // deliveries gave up): a conflicting twin sent earlier would
            // become the order. (A fixed 600 s bound let seven twins go first
            // in a 2000-order SQL Server run whose backlog took longer.)
            let _ = rx.wait_for(|a| *a).await;
            tokio::time::sleep(d.start_at).await;
        } else {
            tokio::time::sleep_until((started + d.start_at).into()).await;
        }
        let body = serde_json::to_vec(&common::invocation(d.trigger.clone())).unwrap();
        // When this delivery's handler died under it, and whether a retry then
        // found the order held by the dead worker's reservation.
        let mut died_at: Option<Instant> = None;
        let mut blocked = false;
        let mut last_status = 0;
        for attempt in 0..d.max_attempts {
            let slot = rng.gen_range(0..self.ports.len());
            let url = format!("http://127.0.0.1:{}/OrderTrigger", self.ports[slot]);
            self.tally.attempts.fetch_add(1, Ordering::Relaxed);
            let answer = {
                let _permit = self.in_flight.acquire().await.unwrap();
                common::try_send(
                    &self.client,
                    &url,
                    body.clone(),
                    d.chunked,
                    FUNCTION_TIMEOUT,
                )
                .await
            };
            match answer {
                Ok(raw) => match raw.verdict() {
                    Verdict::Succeeded(v) => {
                        self.judge_success(&d, &v);
                        self.tally.acked.fetch_add(1, Ordering::Relaxed);
                        if let (Some(t), true) = (died_at, blocked) {
                            self.tally.orphan_waits.lock().unwrap().push(t.elapsed());
                        }
                        return;
                    }
                    Verdict::Failed { status, body } => {
                        last_status = status;
                        let held = self.judge_failure(&d, status, body.as_ref(), &raw.bytes);
                        blocked |= held && died_at.is_some();
                    }
                    Verdict::Hang => problem(
                        &self.problems,
                        format!(
                            "2xx with an empty/null body (the host would hang): {:?}",
                            d.expects
                        ),
                    ),
                },
                Err(e) if e.contains("function timeout") => {
                    // The host fails the invocation and restarts the handler.
                    self.tally.timeouts.fetch_add(1, Ordering::Relaxed);
                    self.stats.timeout_restarts.fetch_add(1, Ordering::Relaxed);
                    died_at.get_or_insert_with(Instant::now);
                    let (tx, rx) = oneshot::channel();
                    if self.kill_txs[slot].send(tx).is_ok() {
                        let _ = rx.await;
                    }
                }
                Err(_) => {
                    self.tally.connection_errors.fetch_add(1, Ordering::Relaxed);
                    died_at.get_or_insert_with(Instant::now);
                }
            }
            tokio::time::sleep(backoff(attempt, &mut rng)).await;
        }
        if d.max_attempts < MAX_ATTEMPTS {
            dead_letter(&self.dead_letters, &d, last_status).await;
            self.tally
                .dead_lettered
                .fetch_add(d.expects.len() as u64, Ordering::Relaxed);
            return;
        }
        self.tally.undelivered.fetch_add(1, Ordering::Relaxed);
        problem(
            &self.problems,
            format!("delivery {:?} got no 2xx in {MAX_ATTEMPTS} attempts (Event Grid would dead-letter it)", d.expects),
        );
    }

    pub(crate) fn count_outcome(&self, outcome: &str) {
        *self
            .tally
            .outcomes
            .lock()
            .unwrap()
            .entry(outcome.to_string())
            .or_default() += 1;
    }

    /// The per-event results of a JSON answer body.
    pub(crate) fn results<'a>(&self, d: &Delivery, body: &'a Value) -> Option<Vec<&'a Value>> {
        let rv = body.get("ReturnValue")?;
        if d.batch {
            let r = rv.get("results")?.as_array()?;
            (r.len() == d.expects.len()).then(|| r.iter().collect())
        } else {
            Some(vec![rv])
        }
    }

    pub(crate) fn judge_success(&self, d: &Delivery, body: &Value) {
        let Some(results) = self.results(d, body) else {
            problem(
                &self.problems,
                format!(
                    "2xx answer without per-event results for {:?}: {body}",
                    d.expects
                ),
            );
            return;
        };
        for (expect, r) in d.expects.iter().zip(results) {
            let outcome = r.get("outcome").and_then(Value::as_str).unwrap_or("?");
            self.count_outcome(outcome);
            if r.get("guard").and_then(Value::as_str) == Some("unavailable") {
                self.tally.guard_unavailable.fetch_add(1, Ordering::Relaxed);
                self.tally
                    .guard_unavailable_at
                    .lock()
                    .unwrap()
                    .push(Instant::now());
            }
            let reason = r.get("reason").and_then(Value::as_str).unwrap_or("");
            match (*expect, outcome) {
                (Expect::Order(i), "executed") => {
                    *self
                        .tally
                        .executed_answers
                        .lock()
                        .unwrap()
                        .entry(i)
                        .or_default() += 1;
                    self.tally.executed_at.lock().unwrap().push(Instant::now());
                }
                (Expect::Order(i), "duplicate") => {
                    self.tally
                        .duplicate_acks
                        .lock()
                        .unwrap()
                        .push((i, Instant::now()));
                }
                (Expect::Conflict(c), "conflict") => {
                    *self.tally.conflict_acks.lock().unwrap().entry(c).or_default() += 1;
                }
                (Expect::Poison(p), "rejected") => {
                    let want = self.poison[p].reason;
                    if !reason.contains(want) {
                        problem(
                            &self.problems,
                            format!(
                                "poison event ({}) rejected with reason {reason:?}, which does not say {want:?}",
                                self.poison[p].label
                            ),
                        );
                    }
                    *self.tally.poison_acks.lock().unwrap().entry(p).or_default() += 1;
                }
                (e, o) => problem(
                    &self.problems,
                    format!("2xx answer with outcome {o:?} for {e:?} (the host would acknowledge it): {r}"),
                ),
            }
        }
        // Every event of an acknowledged delivery is done: late deliveries may go.
        for expect in &d.expects {
            if let Expect::Order(i) = expect {
                self.acks[*i].send_replace(true);
            }
        }
    }

    /// Judge a failed answer; true when an event was `in_progress` (held by
    /// another reservation).
    pub(crate) fn judge_failure(
        &self,
        d: &Delivery,
        status: u16,
        body: Option<&Value>,
        bytes: &[u8],
    ) -> bool {
        if status != 500 {
            // 400/413 are not retried by Event Grid: the order would be lost.
            problem(
                &self.problems,
                format!(
                    "status {status} for {:?} (Event Grid would not retry it): {}",
                    d.expects,
                    String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
                ),
            );
            return false;
        }
        self.tally.failed_500.fetch_add(1, Ordering::Relaxed);
        let results = body.and_then(|b| self.results(d, b)).unwrap_or_default();
        let mut asks_redelivery = false;
        let mut held = false;
        for r in results {
            let outcome = r.get("outcome").and_then(Value::as_str).unwrap_or("?");
            self.count_outcome(outcome);
            asks_redelivery |= matches!(outcome, "in_progress" | "retry");
            held |= outcome == "in_progress";
        }
        if !asks_redelivery {
            problem(
                &self.problems,
                format!(
                    "500 without an in_progress/retry outcome for {:?}: {}",
                    d.expects,
                    String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
                ),
            );
        }
        held
    }
}
