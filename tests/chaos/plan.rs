//! The plan: orders, conflicting and poison events, and their deliveries.

use super::*;

/// A valid order: it must end `Executed` exactly once.
#[derive(Debug, Clone)]
pub(crate) struct ValidOrder {
    pub(crate) id: String,
    pub(crate) account: String,
    pub(crate) symbol: &'static str,
    pub(crate) side: &'static str,
    pub(crate) quantity: Decimal,
    pub(crate) limit_price: Decimal,
}

impl ValidOrder {
    pub(crate) fn signed(&self) -> Decimal {
        if self.side == "buy" {
            self.quantity
        } else {
            -self.quantity
        }
    }
}

/// A different order reusing a valid order's id: must be stored as a conflict.
#[derive(Debug, Clone)]
pub(crate) struct ConflictEvent {
    pub(crate) order: usize,
    pub(crate) event_id: String,
}

/// An invalid event: must be stored as poison with its reason.
#[derive(Debug, Clone)]
pub(crate) struct PoisonEvent {
    pub(crate) label: &'static str,
    /// The event id the handler can read from it, if it has one.
    pub(crate) event_id: Option<String>,
    /// The stored `RawEvent` text, for events without a readable id.
    pub(crate) raw: String,
    pub(crate) reason: &'static str,
}

/// What one event of a delivery must end as.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expect {
    Order(usize),
    Conflict(usize),
    Poison(usize),
}

/// How an order event is put on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Form {
    EventGrid,
    CloudEvent,
    String,
    DoubleString,
    DataString,
    Chunked,
}

pub(crate) const FORMS: [(Form, u32); 6] = [
    (Form::EventGrid, 50),
    (Form::CloudEvent, 15),
    (Form::String, 12),
    (Form::DoubleString, 5),
    (Form::DataString, 8),
    (Form::Chunked, 10),
];

/// One Event Grid delivery: one invocation (one event, or a batch held in a
/// string as with `"cardinality": "many"`), redelivered until it gets a 2xx.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) trigger: Value,
    pub(crate) expects: Vec<Expect>,
    pub(crate) batch: bool,
    pub(crate) chunked: bool,
    /// When it is first sent, from the start (or from the ack of `after_ack_of`).
    pub(crate) start_at: Duration,
    /// A late delivery: sent only after this order was acknowledged.
    pub(crate) after_ack_of: Option<usize>,
    /// Attempts before Event Grid gives up: [`MAX_ATTEMPTS`], or a short
    /// budget after which the delivery is dead-lettered (`dead_letters`).
    pub(crate) max_attempts: u32,
}

pub(crate) struct Plan {
    pub(crate) orders: Vec<ValidOrder>,
    pub(crate) conflicts: Vec<ConflictEvent>,
    pub(crate) poison: Vec<PoisonEvent>,
    pub(crate) deliveries: Vec<Delivery>,
    /// Event ids carried by valid orders (none may ever be rejected).
    pub(crate) valid_event_ids: HashSet<String>,
    pub(crate) spread: Duration,
}

pub(crate) fn random_id(rng: &mut StdRng) -> String {
    let v: u128 = rng.gen();
    uuid::Uuid::from_u128(v).to_string()
}

/// A JSON number with exactly this text (the handler parses numbers exactly).
pub(crate) fn number(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text} is not a JSON number: {e}"))
}

/// The quantity as a publisher might write it: number or string, sometimes
/// with a trailing zero (the fingerprint must not care).
pub(crate) fn quantity_value(rng: &mut StdRng, q: Decimal) -> Value {
    let mut text = q.to_string();
    if rng.gen_bool(0.2) {
        text.push_str(if text.contains('.') { "0" } else { ".0" });
    }
    if rng.gen_bool(0.3) {
        Value::String(text)
    } else {
        number(&text)
    }
}

pub(crate) fn order_data(rng: &mut StdRng, o: &ValidOrder, quantity: Decimal) -> Value {
    let side = if rng.gen_bool(0.1) {
        o.side.to_ascii_uppercase()
    } else {
        o.side.to_string()
    };
    let symbol = if rng.gen_bool(0.1) {
        o.symbol.to_ascii_lowercase()
    } else {
        o.symbol.to_string()
    };
    json!({
        "orderId": o.id, "accountId": o.account, "side": side, "symbol": symbol,
        "quantity": quantity_value(rng, quantity),
        "limitPrice": number(&o.limit_price.to_string()),
        "currency": "USD", "placedAt": "2025-06-14T09:30:02.118Z"
    })
}

pub(crate) fn eg_envelope(event_id: &str, subject: &str, data: Value) -> Value {
    json!({
        "id": event_id, "topic": TOPIC, "subject": format!("orders/{subject}"),
        "eventType": "Trading.Order.Placed", "eventTime": "2025-06-14T09:30:02.1180000Z",
        "data": data, "dataVersion": "1.0", "metadataVersion": "1"
    })
}

pub(crate) fn ce_envelope(event_id: &str, subject: &str, data: Value) -> Value {
    json!({
        "specversion": "1.0", "type": "Trading.Order.Placed", "source": TOPIC,
        "id": event_id, "time": "2025-06-14T09:30:02.118Z",
        "subject": format!("orders/{subject}"), "datacontenttype": "application/json",
        "data": data
    })
}

/// The trigger value for one event in `form`, and whether to send it chunked.
pub(crate) fn render(form: Form, event_id: &str, subject: &str, data: Value) -> (Value, bool) {
    match form {
        Form::EventGrid => (eg_envelope(event_id, subject, data), false),
        Form::Chunked => (eg_envelope(event_id, subject, data), true),
        Form::CloudEvent => (ce_envelope(event_id, subject, data), false),
        Form::String => (
            Value::String(eg_envelope(event_id, subject, data).to_string()),
            false,
        ),
        Form::DoubleString => {
            let once = Value::String(eg_envelope(event_id, subject, data).to_string());
            (Value::String(once.to_string()), false)
        }
        Form::DataString => (
            eg_envelope(event_id, subject, Value::String(data.to_string())),
            false,
        ),
    }
}

pub(crate) fn pick_form(rng: &mut StdRng) -> Form {
    let total: u32 = FORMS.iter().map(|(_, w)| w).sum();
    let mut x = rng.gen_range(0..total);
    for (f, w) in FORMS {
        if x < w {
            return f;
        }
        x -= w;
    }
    Form::EventGrid
}

/// The poison kinds: how each is built and the reason it must be stored with.
pub(crate) fn poison_event(
    rng: &mut StdRng,
    kind: usize,
    run: &str,
    j: usize,
) -> (Value, PoisonEvent) {
    let order_id = format!("chaos-{run}-p{j:04}");
    let event_id = random_id(rng);
    let data = json!({
        "orderId": order_id, "accountId": "acct-poison", "side": "buy", "symbol": "MSFT",
        "quantity": 5, "currency": "USD"
    });
    let with = |key: &str, v: Value| {
        let mut d = data.clone();
        d[key] = v;
        eg_envelope(&event_id, &order_id, d)
    };
    let (trigger, label, reason): (Value, &'static str, &'static str) = match kind % 7 {
        0 => (
            with("side", json!("hold")),
            "unknown side",
            "\"buy\" or \"sell\"",
        ),
        1 => (
            with("quantity", json!(-5)),
            "negative quantity",
            "greater than 0",
        ),
        2 => (
            with("quantity", number("1e25")),
            "exponent quantity out of range",
            "at most 18 are allowed",
        ),
        3 => {
            let mut e = eg_envelope(&event_id, &order_id, Value::Null);
            e.as_object_mut().unwrap().remove("data");
            (e, "event without data", "has no 'data'")
        }
        4 => (
            eg_envelope(&event_id, &order_id, json!(42)),
            "data not an object",
            "JSON object holding the order",
        ),
        5 => {
            let mut e = ce_envelope(&event_id, &order_id, data.clone());
            e.as_object_mut().unwrap().remove("source");
            (e, "cloudevent without source", "'source' is required")
        }
        _ => {
            let s = format!("{{\"id\":\"{event_id}\",\"eventType\": oops");
            return (
                Value::String(s.clone()),
                PoisonEvent {
                    label: "string that is not JSON",
                    event_id: None,
                    raw: Value::String(s).to_string(),
                    reason: "string that is not JSON",
                },
            );
        }
    };
    let raw = trigger.to_string();
    (
        trigger,
        PoisonEvent {
            label,
            event_id: Some(event_id),
            raw,
            reason,
        },
    )
}

/// The plan of `n` orders, spread over at least `min_spread` (room for the
/// store faults' slots).
pub(crate) fn plan(rng: &mut StdRng, n: usize, run: &str, min_spread: Duration) -> Plan {
    let spread = Duration::from_millis((n as u64 * 20).max(10_000)).max(min_spread);
    let spread_ms = spread.as_millis() as u64;
    let mut orders = Vec::with_capacity(n);
    let mut deliveries = Vec::new();
    let mut valid_event_ids = HashSet::new();
    for i in 0..n {
        let o = ValidOrder {
            id: format!("chaos-{run}-{i:05}"),
            account: format!("acct-{}", rng.gen_range(0..ACCOUNTS)),
            symbol: SYMBOLS[rng.gen_range(0..SYMBOLS.len())],
            side: if rng.gen_bool(0.6) { "buy" } else { "sell" },
            quantity: Decimal::new(rng.gen_range(1..=500_000), rng.gen_range(0..=3)).normalize(),
            limit_price: Decimal::new(rng.gen_range(100..=99_999), 2).normalize(),
        };
        let event_id = random_id(rng);
        let early = rng.gen_range(1..=5);
        let clustered = rng.gen_bool(0.5);
        let base = rng.gen_range(0..spread_ms);
        let late = if rng.gen_bool(0.3) {
            rng.gen_range(1..=2)
        } else {
            0
        };
        for c in 0..early + late {
            // Mostly Event Grid redelivering the same event; sometimes the
            // publisher sent the order again under a new event id.
            let id = if rng.gen_bool(0.8) {
                event_id.clone()
            } else {
                random_id(rng)
            };
            valid_event_ids.insert(id.clone());
            let data = order_data(rng, &o, o.quantity);
            let (trigger, chunked) = render(pick_form(rng), &id, &o.id, data);
            let is_late = c >= early;
            let start_ms = if is_late {
                rng.gen_range(0..500)
            } else if clustered {
                base + rng.gen_range(0..20)
            } else {
                rng.gen_range(0..spread_ms)
            };
            deliveries.push(Delivery {
                trigger,
                expects: vec![Expect::Order(i)],
                batch: false,
                chunked,
                start_at: Duration::from_millis(start_ms),
                after_ack_of: is_late.then_some(i),
                max_attempts: MAX_ATTEMPTS,
            });
        }
        orders.push(o);
    }

    // A few batches (one invocation holding several events in a string, as
    // with "cardinality": "many"): all-or-none.
    let mut batched = Vec::new();
    let mut rest = Vec::new();
    for d in deliveries {
        if d.after_ack_of.is_none() && !d.chunked && d.trigger.is_object() && rng.gen_bool(0.06) {
            batched.push(d);
        } else {
            rest.push(d);
        }
    }
    let mut deliveries = rest;
    for group in batched.chunks(3) {
        let events: Vec<Value> = group.iter().map(|d| d.trigger.clone()).collect();
        let trigger = if rng.gen_bool(0.7) {
            Value::String(Value::Array(events).to_string())
        } else {
            Value::Array(events)
        };
        deliveries.push(Delivery {
            trigger,
            expects: group.iter().flat_map(|d| d.expects.clone()).collect(),
            batch: true,
            chunked: false,
            start_at: group.iter().map(|d| d.start_at).min().unwrap(),
            after_ack_of: None,
            max_attempts: MAX_ATTEMPTS,
        });
    }

    // Conflicts: a different order under an id already acknowledged.
    let mut conflicts = Vec::new();
    for _ in 0..(n / 50).max(2).min(n) {
        let order = rng.gen_range(0..n);
        let event_id = random_id(rng);
        let o = orders[order].clone();
        let data = order_data(rng, &o, o.quantity + Decimal::ONE);
        let (trigger, chunked) = render(pick_form(rng), &event_id, &o.id, data);
        for _ in 0..rng.gen_range(1..=2) {
            deliveries.push(Delivery {
                trigger: trigger.clone(),
                expects: vec![Expect::Conflict(conflicts.len())],
                batch: false,
                chunked,
                start_at: Duration::from_millis(rng.gen_range(0..800)),
                after_ack_of: Some(order),
                max_attempts: MAX_ATTEMPTS,
            });
        }
        conflicts.push(ConflictEvent { order, event_id });
    }

    // Poison: every kind at least once, each redelivered identically.
    let mut poison = Vec::new();
    for j in 0..(n / 40).max(7) {
        let (trigger, p) = poison_event(rng, j, run, j);
        for _ in 0..rng.gen_range(1..=3) {
            deliveries.push(Delivery {
                trigger: trigger.clone(),
                expects: vec![Expect::Poison(j)],
                batch: false,
                chunked: false,
                start_at: Duration::from_millis(rng.gen_range(0..spread_ms)),
                after_ack_of: None,
                max_attempts: MAX_ATTEMPTS,
            });
        }
        poison.push(p);
    }
    deliveries.shuffle(rng);
    Plan {
        orders,
        conflicts,
        poison,
        deliveries,
        valid_event_ids,
        spread,
    }
}
