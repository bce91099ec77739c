//! A real Azurite (Microsoft's Blob and Queue Storage emulator) owned by one test, on
//! a free loopback port, in memory, with telemetry off (by default Azurite
//! reports usage to a host on the internet). Installed into `.tools/` by
//! `scripts/ensure-azurite.sh`; a test that needs it fails, never skips,
//! when it is missing or does not start.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use order_guard::deadletter::Container;
use order_guard::deadletter::DeadLetterSettings;
use order_guard::storage::{EMULATOR_ACCOUNT, EMULATOR_KEY};
use sha2::{Digest, Sha256};

pub struct Azurite {
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Azurite {
    pub fn start() -> Azurite {
        Azurite::start_with_memory_mb(256)
    }

    /// Azurite holding at most `mb` MiB of blob content in memory (a test
    /// of large blobs needs more than the default).
    pub fn start_with_memory_mb(mb: u32) -> Azurite {
        Azurite::launch("blob", &["--extentMemoryLimit".to_string(), mb.to_string()])
    }

    /// Azurite's Queue Storage (`azurite-queue`), in memory: the outbox's
    /// destination.
    pub fn start_queue() -> Azurite {
        Azurite::launch("queue", &[])
    }

    /// `azurite-<service>` on a free loopback port, with `extra` arguments.
    fn launch(service: &str, extra: &[String]) -> Azurite {
        let bin = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!(".tools/node_modules/.bin/azurite-{service}"));
        assert!(
            bin.exists(),
            "Azurite is missing ({}): these tests need a real Blob and Queue Storage API. Run scripts/ensure-azurite.sh (scripts/test.sh does), which installs the npm package azurite into .tools/",
            bin.display()
        );
        let port = super::free_port();
        let dir = tempfile::tempdir().expect("temp dir");
        // Never without --disableTelemetry: by default Azurite reports usage
        // to a Microsoft host on the internet.
        let mut child = Command::new(&bin)
            .arg("--disableTelemetry")
            .args([
                format!("--{service}Host"),
                "127.0.0.1".into(),
                format!("--{service}Port"),
                port.to_string(),
                "--skipApiVersionCheck".into(),
                "--silent".into(),
                "--inMemoryPersistence".into(),
            ])
            .args(extra)
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Azurite ({}): {e}", bin.display()));
        // Its start-up lines, until it says it listens (bounded by the
        // process: a failed start closes stdout).
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let ready = line.contains("successfully listens");
                let _ = tx.send(line);
                if ready {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(line) if line.contains("successfully listens") => break,
                Ok(line) => seen.push(line),
                Err(_) => {
                    let _ = child.kill();
                    panic!("Azurite did not start on 127.0.0.1:{port}; it said: {seen:?}");
                }
            }
        }
        Azurite {
            port,
            child: Some(child),
            _dir: dir,
        }
    }

    /// The connection string of this Azurite's queue service, as
    /// `OUTBOX_STORAGE` takes it.
    pub fn queue_connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={EMULATOR_ACCOUNT};AccountKey={EMULATOR_KEY};QueueEndpoint={}/;",
            self.endpoint()
        )
    }

    /// `PUT /<queue>`, signed with the emulator's shared key (the
    /// dispatcher's SAS may only add messages, as in production).
    pub async fn create_queue(&self, name: &str) {
        let (status, body) = self
            .signed(
                "PUT",
                &format!("/{EMULATOR_ACCOUNT}/{EMULATOR_ACCOUNT}/{name}"),
                &format!("/{name}"),
            )
            .await;
        assert!(
            status == 201 || status == 204,
            "create queue {name}: {status} {body}"
        );
    }

    /// Every message in `queue`, taken off it: the texts, decoded from
    /// base64 when `base64`.
    pub async fn drain_queue(&self, queue: &str, base64: bool) -> Vec<String> {
        use azure_storage_queue::models::QueueClientReceiveMessagesOptions;
        use base64::Engine;
        let sas = order_guard::outbox::queue::queue_sas(
            EMULATOR_ACCOUNT,
            queue,
            EMULATOR_KEY,
            "rp",
            std::time::SystemTime::now() + Duration::from_secs(3600),
        )
        .unwrap();
        let url = format!("{}/{queue}?{sas}", self.endpoint());
        order_guard::tls::install_crypto_provider();
        let client = azure_storage_queue::QueueClient::new(
            azure_core::http::Url::parse(&url).unwrap(),
            None,
            None,
        )
        .unwrap();
        let mut texts = Vec::new();
        loop {
            let options = QueueClientReceiveMessagesOptions {
                number_of_messages: Some(32),
                visibility_timeout: Some(3600),
                ..Default::default()
            };
            let received = client
                .receive_messages(Some(options))
                .await
                .expect("Azurite's queue answers")
                .into_model()
                .expect("a list of messages");
            let batch = received.items.unwrap_or_default();
            if batch.is_empty() {
                return texts;
            }
            for m in batch {
                let text = m.message_text.unwrap_or_default();
                texts.push(if base64 {
                    String::from_utf8(
                        base64::engine::general_purpose::STANDARD
                            .decode(&text)
                            .expect("base64"),
                    )
                    .unwrap()
                } else {
                    text
                });
            }
        }
    }

    /// When each message waiting in `queue` expires, as the queue service
    /// keeps it (a peek: the messages stay).
    pub async fn expiries(&self, queue: &str) -> Vec<azure_core::time::OffsetDateTime> {
        use azure_storage_queue::models::QueueClientPeekMessagesOptions;
        let sas = order_guard::outbox::queue::queue_sas(
            EMULATOR_ACCOUNT,
            queue,
            EMULATOR_KEY,
            "r",
            std::time::SystemTime::now() + Duration::from_secs(3600),
        )
        .unwrap();
        let url = format!("{}/{queue}?{sas}", self.endpoint());
        order_guard::tls::install_crypto_provider();
        let client = azure_storage_queue::QueueClient::new(
            azure_core::http::Url::parse(&url).unwrap(),
            None,
            None,
        )
        .unwrap();
        let options = QueueClientPeekMessagesOptions {
            number_of_messages: Some(32),
            ..Default::default()
        };
        client
            .peek_messages(Some(options))
            .await
            .expect("Azurite's queue answers")
            .into_model()
            .expect("a list of messages")
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.expiration_time.expect("an expiry"))
            .collect()
    }

    /// A request with an empty body, signed with the emulator's shared key:
    /// `resource` as the string to sign names it, `path` on this Azurite.
    async fn signed(&self, method: &str, resource: &str, path: &str) -> (u16, String) {
        let date = httpdate(std::time::SystemTime::now());
        let version = "2021-08-06";
        let to_sign = format!(
            "{method}\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n{resource}"
        );
        use base64::Engine;
        let key = base64::engine::general_purpose::STANDARD
            .decode(EMULATOR_KEY)
            .unwrap();
        let signature =
            base64::engine::general_purpose::STANDARD.encode(hmac_sha256(&key, to_sign.as_bytes()));
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.endpoint()))
            .header("x-ms-date", &date)
            .header("x-ms-version", version)
            .header("content-length", "0")
            .header(
                "authorization",
                format!("SharedKey {EMULATOR_ACCOUNT}:{signature}"),
            )
            .body(hyper::Body::empty())
            .unwrap();
        let response = hyper::Client::new()
            .request(request)
            .await
            .expect("Azurite answers");
        let status = response.status().as_u16();
        let body = hyper::body::to_bytes(response.into_body()).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Azurite's blob endpoint (path-style).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{EMULATOR_ACCOUNT}", self.port)
    }

    /// The connection string of this Azurite, as `DEAD_LETTER_STORAGE` takes it.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={EMULATOR_ACCOUNT};AccountKey={EMULATOR_KEY};BlobEndpoint={}/;",
            self.endpoint()
        )
    }

    /// The sweep's settings for `container` here.
    pub fn settings(&self, container: &str) -> DeadLetterSettings {
        DeadLetterSettings {
            storage: order_guard::storage::parse_storage(&self.connection_string()).unwrap(),
            container: container.to_string(),
            max_blob_bytes: order_guard::deadletter::DEFAULT_MAX_BLOB_BYTES,
        }
    }

    /// Create `name` (object_store makes no containers) and open it.
    pub async fn container(&self, name: &str) -> Container {
        self.create_container(name).await;
        Container::open(&self.settings(name)).unwrap()
    }

    /// `PUT ?restype=container`, signed with the emulator's shared key.
    pub async fn create_container(&self, name: &str) {
        let (status, body) = self
            .signed(
                "PUT",
                &format!("/{EMULATOR_ACCOUNT}/{EMULATOR_ACCOUNT}/{name}\nrestype:container"),
                &format!("/{name}?restype=container"),
            )
            .await;
        assert!(
            status == 201 || status == 409,
            "create container {name}: {status} {body}"
        );
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| k.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().to_vec()
}

/// RFC 1123 date, as `x-ms-date` wants it.
fn httpdate(t: std::time::SystemTime) -> String {
    let now = time::OffsetDateTime::from(t);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        &now.weekday().to_string()[..3],
        now.day(),
        &now.month().to_string()[..3],
        now.year(),
        now.hour(),
        now.minute(),
        now.second()
    )
}
