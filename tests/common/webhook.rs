//! Event Grid's webhook as the tests meet it: a local token issuer with
//! keys of its own (an RSA key made by `openssl` for each issuer, never a
//! real tenant's), tokens as Entra ID issues them to Event Grid, and
//! deliveries as Event Grid sends them.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use warp::Filter;

/// The tenant the tests' issuer speaks for.
pub const TENANT: &str = "11111111-2222-3333-4444-555555555555";
/// The webhook app's audience in the tests.
pub const AUDIENCE: &str = "api://order-guard-webhook";
/// Event Grid's application id, as Entra ID names it in its tokens.
pub const EVENT_GRID_APP_ID: &str = "4962773b-9cdb-44cf-a8bf-237846a00ab7";
/// The app role Event Grid is assigned on the webhook's app.
pub const ROLE: &str = "AzureEventGridSecureWebhookSubscriber";

/// An RSA signing key: its private PEM and its public JWK.
pub struct SigningKey {
    pub kid: String,
    pem: Vec<u8>,
    pub jwk: Value,
}

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("the tests' token issuer needs openssl (apt-get install openssl): {e}")
        });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn base64url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl SigningKey {
    /// A new 2048-bit key named `kid`.
    pub fn new(kid: &str, dir: &Path) -> SigningKey {
        let path = dir.join(format!("{kid}.pem"));
        let path = path.to_str().unwrap();
        openssl(&["genrsa", "-out", path, "2048"]);
        let pem = std::fs::read(path).unwrap();
        let modulus =
            String::from_utf8(openssl(&["rsa", "-in", path, "-noout", "-modulus"])).unwrap();
        let hex = modulus.trim().trim_start_matches("Modulus=");
        let n: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let jwk = json!({
            "kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
            "n": base64url(&n), "e": "AQAB",
        });
        SigningKey {
            kid: kid.to_string(),
            pem,
            jwk,
        }
    }

    /// A token with these claims, signed by this key.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(self.kid.clone());
        encode(
            &header,
            claims,
            &EncodingKey::from_rsa_pem(&self.pem).expect("the issuer's key"),
        )
        .expect("sign")
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The claims Entra ID puts in the token it issues to Event Grid for the
/// webhook's app (a v1 token); tests change one at a time.
pub fn event_grid_claims() -> Value {
    let now = now();
    json!({
        "aud": AUDIENCE,
        "iss": format!("https://sts.windows.net/{TENANT}/"),
        "iat": now - 10, "nbf": now - 10, "exp": now + 3600,
        "appid": EVENT_GRID_APP_ID,
        "roles": [ROLE],
        "tid": TENANT,
    })
}

/// How the issuer's key endpoint answers: each fetch waits `delay`, then
/// is answered `status` (200: the keys).
#[derive(Clone, Copy)]
struct Outage {
    status: u16,
    delay: std::time::Duration,
}

/// A local issuer: the tenant's JWKS document served on loopback at
/// `/{TENANT}/discovery/v2.0/keys`, with the keys it publishes changeable
/// (a key roll) and its fetches counted.
pub struct Issuer {
    pub addr: SocketAddr,
    pub key: SigningKey,
    published: Arc<Mutex<Vec<Value>>>,
    fetches: Arc<AtomicUsize>,
    outage: Arc<Mutex<Outage>>,
    issuers: Arc<Mutex<[String; 2]>>,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Issuer {
    /// Listening on `addr` (port 0: a free one), publishing one key.
    pub async fn start_on(addr: SocketAddr) -> Issuer {
        let dir = tempfile::tempdir().unwrap();
        let key = SigningKey::new("key-1", dir.path());
        let published = Arc::new(Mutex::new(vec![key.jwk.clone()]));
        let fetches = Arc::new(AtomicUsize::new(0));
        let outage = Arc::new(Mutex::new(Outage {
            status: 200,
            delay: std::time::Duration::ZERO,
        }));
        // The tenant's OpenID configuration documents (v1, v2): what the
        // webhook reads its tokens' issuers from; the public cloud's unless
        // a test says otherwise.
        let issuers = Arc::new(Mutex::new([
            format!("https://sts.windows.net/{TENANT}/"),
            format!("https://login.microsoftonline.com/{TENANT}/v2.0"),
        ]));
        let configuration = {
            let issuers = Arc::clone(&issuers);
            let outage = Arc::clone(&outage);
            warp::get()
                .and(warp::path::param::<String>())
                .and(
                    warp::path!(".well-known" / "openid-configuration")
                        .map(|| 0)
                        .or(warp::path!("v2.0" / ".well-known" / "openid-configuration").map(|| 1))
                        .unify(),
                )
                .map(move |tenant: String, version: usize| {
                    assert_eq!(tenant, TENANT, "configuration asked for another tenant");
                    let issuer = issuers.lock().unwrap()[version].clone();
                    let status = outage.lock().unwrap().status;
                    let status = warp::http::StatusCode::from_u16(status).unwrap();
                    warp::reply::with_status(
                        warp::reply::json(&json!({ "issuer": issuer })),
                        status,
                    )
                })
        };
        let keys = {
            let published = Arc::clone(&published);
            let fetches = Arc::clone(&fetches);
            let outage = Arc::clone(&outage);
            warp::get()
                .and(warp::path!(String / "discovery" / "v2.0" / "keys"))
                .then(move |tenant: String| {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(tenant, TENANT, "keys asked for another tenant");
                    let keys = json!({ "keys": *published.lock().unwrap() });
                    let Outage { status, delay } = *outage.lock().unwrap();
                    async move {
                        tokio::time::sleep(delay).await;
                        let status = warp::http::StatusCode::from_u16(status).unwrap();
                        warp::reply::with_status(warp::reply::json(&keys), status)
                    }
                })
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let routes = keys.or(configuration);
        let (addr, server) = warp::serve(routes).bind_with_graceful_shutdown(addr, async move {
            let _ = rx.await;
        });
        tokio::spawn(server);
        Issuer {
            addr,
            key,
            published,
            fetches,
            outage,
            issuers,
            _dir: dir,
            stop: Some(tx),
        }
    }

    pub async fn start() -> Issuer {
        Issuer::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// `WEBHOOK_AUTHORITY` for this issuer.
    pub fn authority(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The settings of a webhook that trusts this issuer.
    pub fn settings(&self) -> Vec<(String, String)> {
        vec![
            ("WEBHOOK_TENANT_ID".into(), TENANT.into()),
            ("WEBHOOK_AUDIENCE".into(), AUDIENCE.into()),
            ("WEBHOOK_AUTHORITY".into(), self.authority()),
        ]
    }

    /// A valid token for Event Grid's deliveries.
    pub fn token(&self) -> String {
        self.key.sign(&event_grid_claims())
    }

    /// Publish these keys from now on (a key roll).
    pub fn publish(&self, keys: &[&SigningKey]) {
        *self.published.lock().unwrap() = keys.iter().map(|k| k.jwk.clone()).collect();
    }

    /// From now on every fetch of the keys waits `delay`, then is answered
    /// `status` (200 with the keys: the endpoint is back).
    pub fn answer_keys(&self, status: u16, delay: std::time::Duration) {
        *self.outage.lock().unwrap() = Outage { status, delay };
    }

    /// Publish these issuers (v1, v2) in the OpenID configuration from
    /// now on (a sovereign cloud's).
    pub fn set_issuers(&self, v1: &str, v2: &str) {
        *self.issuers.lock().unwrap() = [v1.to_string(), v2.to_string()];
    }

    /// How many times the keys were fetched.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// A key this issuer does not (yet) publish.
    pub fn new_key(&self, kid: &str) -> SigningKey {
        SigningKey::new(kid, self._dir.path())
    }

    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An answer of the webhook: status, headers and JSON body (`Null` when
/// the body is empty).
pub struct WebhookAnswer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Value,
}

/// Send a request to the webhook at `base` (`http://host:port`).
pub async fn webhook_request(
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> WebhookAnswer {
    let mut req = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let req = req
        .header("Content-Length", body.len())
        .body(hyper::Body::from(body))
        .unwrap();
    let resp = hyper::Client::new().request(req).await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = hyper::body::to_bytes(resp.into_body()).await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "answer is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    WebhookAnswer {
        status,
        headers,
        body,
    }
}

/// A delivery as Event Grid sends one in its own schema: the events as a
/// JSON array, with `aeg-event-type: Notification` and the token.
pub async fn deliver(base: &str, token: Option<&str>, events: &Value) -> WebhookAnswer {
    let mut headers = vec![
        ("Content-Type", "application/json".to_string()),
        ("aeg-event-type", "Notification".to_string()),
    ];
    if let Some(t) = token {
        headers.push(("Authorization", format!("Bearer {t}")));
    }
    webhook_request(
        "POST",
        &format!("{base}/events"),
        &headers,
        serde_json::to_vec(events).unwrap(),
    )
    .await
}

/// The outcome of each event of an answer, in order.
pub fn outcomes(answer: &WebhookAnswer) -> Vec<String> {
    answer.body["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {}", answer.body))
        .iter()
        .map(|r| r["outcome"].as_str().unwrap().to_string())
        .collect()
}

/// The validation event Event Grid sends when a subscription is made.
pub fn validation_event(code: &str) -> Value {
    json!([{
        "id": uuid::Uuid::new_v4().to_string(),
        "topic": "/subscriptions/1111/resourceGroups/rg/providers/Microsoft.EventGrid/topics/orders",
        "subject": "",
        "data": {
            "validationCode": code,
            "validationUrl": "https://rp-eastus2.eventgrid.azure.net:553/eventsubscriptions/orders/validate?id=x&t=y"
        },
        "eventType": "Microsoft.EventGrid.SubscriptionValidationEvent",
        "eventTime": "2026-12-05T10:00:00Z",
        "metadataVersion": "1",
        "dataVersion": "2"
    }])
}

/// The drain on SIGTERM as Event Grid meets it, on a webhook at `base`
/// (its `port`) started with `SHUTDOWN_GRACE_SECONDS` of a few seconds;
/// `terminate` sends the signal, `fresh` makes a delivery of a new order.
/// A delivery in flight (its body held back) keeps it from ending early.
/// Readiness fails at once; new deliveries are still taken (200,
/// executed) until the last stretch of the grace, then answered 503; the
/// delivery in flight is finished and answered. The caller then sees the
/// process end.
pub async fn drain_as_event_grid_meets_it(
    base: &str,
    port: u16,
    token: &str,
    fresh: impl Fn() -> Value,
    terminate: impl FnOnce(),
) {
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::to_vec(&fresh()).unwrap();
    let mut held = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let head = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\naeg-event-type: Notification\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    held.write_all(head.as_bytes()).await.unwrap();
    held.write_all(&body[..10]).await.unwrap();
    let alive = |key: &'static str, want: Value| async move {
        let started = Instant::now();
        loop {
            let alive = webhook_request("GET", &format!("{base}/healthz"), &[], Vec::new()).await;
            if alive.body[key] == want {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no {key} = {want}: {}",
                alive.body
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // The webhook counts the delivery once it reads the body.
    alive("inFlight", json!(1)).await;
    terminate();
    alive("draining", json!(true)).await;
    let ready = webhook_request("GET", &format!("{base}/readyz"), &[], Vec::new()).await;
    assert_eq!(ready.status, 503, "not ready from the signal on");
    // Deliveries the ingress still routes here are taken...
    let taken = deliver(base, Some(token), &fresh()).await;
    assert_eq!(
        (taken.status, outcomes(&taken)),
        (200, vec!["executed".to_string()]),
        "{}",
        taken.body
    );
    // ...until the last stretch of the grace, which answers 503.
    let started = Instant::now();
    loop {
        let answer = deliver(base, Some(token), &fresh()).await;
        if answer.status == 503 {
            assert_eq!(answer.body, json!({ "error": "shutting down" }));
            break;
        }
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "deliveries never refused"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The delivery in flight is finished and answered.
    held.write_all(&body[10..]).await.unwrap();
    let mut answer = Vec::new();
    held.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("\"executed\""),
        "{answer}"
    );
}
