//! The SQL Server store's parts that can be checked without a database:
//! every T-SQL statement parses (sqlparser, MsSqlDialect); errors classify by
//! their real numbers, produced by tiberius itself from a login answered by a
//! minimal TDS endpoint on loopback; the connection string parser; Azure's
//! redirect; Entra ID tokens through `azure_identity`'s credentials against
//! a local HTTP endpoint answering as the App Service identity endpoint
//! does, up to the LOGIN7 packet, and the Default chain's logic.
//!
//! The store's behaviour against a real server is the conformance suite
//! (`tests/store_conformance.rs`, with `ORDER_GUARD_TEST_MSSQL`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core::time::OffsetDateTime;
use order_guard::entra::{ChainCredential, ChainLink, TokenSource, SQL_SCOPE};
use order_guard::order::Order;
use order_guard::store::sqlserver::classify;
use order_guard::store::sqlserver::connstr::{Auth, Encrypt, SqlConnInfo};
use order_guard::store::sqlserver::pool::{
    open_following_redirect, ConnectError, SqlConnectionManager,
};
use order_guard::store::sqlserver::sql;
use order_guard::store::sqlserver::SqlServerSettings;
use order_guard::store::{OrderStore, SqlServerStore, StoreError};
use serde_json::json;
use sqlparser::dialect::MsSqlDialect;
use sqlparser::parser::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "../common/identity.rs"]
mod identity;

mod classification;
mod connection_strings;
mod entra_id;
mod pool;
mod tsql;

// ------------------------------------------------- a minimal TDS endpoint

/// How the fake endpoint answers a LOGIN7.
#[derive(Clone)]
enum LoginAnswer {
    /// An ERROR token with this number and text, then DONE.
    Error(u32, &'static str),
    /// An ENVCHANGE routing token to this host and port, then DONE.
    Route(String, u16),
    /// DONE: logged in.
    Accept,
    /// No answer at all: the login hangs until the client gives up.
    Never,
}

/// A loopback endpoint speaking just enough TDS for a login: PRELOGIN (no
/// encryption), one answer to LOGIN7, then a bare DONE for every request.
/// It keeps every login packet.
struct FakeTds {
    port: u16,
    logins: Arc<Mutex<Vec<Vec<u8>>>>,
}

async fn read_message(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; 8];
        s.read_exact(&mut header).await.ok()?;
        let len = u16::from_be_bytes([header[2], header[3]]) as usize;
        let mut body = vec![0u8; len.checked_sub(8)?];
        s.read_exact(&mut body).await.ok()?;
        payload.extend_from_slice(&body);
        if header[1] & 0x01 == 0x01 {
            return Some(payload);
        }
    }
}

fn packet(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() + 8) as u16;
    let mut p = vec![0x04, 0x01];
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[0, 0, 1, 0]);
    p.extend_from_slice(payload);
    p
}

fn utf16(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn done(status: u16) -> Vec<u8> {
    let mut t = vec![0xFD];
    t.extend_from_slice(&status.to_le_bytes());
    t.extend_from_slice(&0u16.to_le_bytes());
    t.extend_from_slice(&0u64.to_le_bytes());
    t
}

fn login_answer(answer: &LoginAnswer) -> Vec<u8> {
    match answer {
        LoginAnswer::Error(number, message) => {
            let (msg, server) = (utf16(message), utf16("fake"));
            let mut body = Vec::new();
            body.extend_from_slice(&number.to_le_bytes());
            body.extend_from_slice(&[1, 14]); // state, class
            body.extend_from_slice(&(message.encode_utf16().count() as u16).to_le_bytes());
            body.extend_from_slice(&msg);
            body.push(4);
            body.extend_from_slice(&server);
            body.push(0); // no procedure
            body.extend_from_slice(&1u32.to_le_bytes()); // line
            let mut t = vec![0xAA];
            t.extend_from_slice(&(body.len() as u16).to_le_bytes());
            t.extend_from_slice(&body);
            t.extend_from_slice(&done(0x0002));
            t
        }
        LoginAnswer::Route(host, port) => {
            let host16 = utf16(host);
            let mut value = vec![0u8]; // protocol: TCP
            value.extend_from_slice(&port.to_le_bytes());
            value.extend_from_slice(&(host.encode_utf16().count() as u16).to_le_bytes());
            value.extend_from_slice(&host16);
            let mut body = vec![20u8]; // ENVCHANGE type: routing
            body.extend_from_slice(&(value.len() as u16).to_le_bytes());
            body.extend_from_slice(&value);
            body.extend_from_slice(&0u16.to_le_bytes()); // old value: none
            let mut t = vec![0xE3];
            t.extend_from_slice(&(body.len() as u16).to_le_bytes());
            t.extend_from_slice(&body);
            t.extend_from_slice(&done(0));
            t
        }
        LoginAnswer::Accept => done(0),
        LoginAnswer::Never => unreachable!("a hanging login is never answered"),
    }
}

impl FakeTds {
    async fn start(answer: LoginAnswer) -> FakeTds {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let logins = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&logins);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (answer, kept) = (answer.clone(), Arc::clone(&kept));
                tokio::spawn(async move {
                    if read_message(&mut s).await.is_none() {
                        return;
                    }
                    // PRELOGIN answer: version 15.0.2000, encryption NOT_SUP.
                    let mut pre = vec![0x00, 0, 11, 0, 6, 0x01, 0, 17, 0, 1, 0xFF];
                    pre.extend_from_slice(&[15, 0, 0x07, 0xD0, 0, 0, 0x02]);
                    s.write_all(&packet(&pre)).await.unwrap();
                    let Some(login) = read_message(&mut s).await else {
                        return;
                    };
                    kept.lock().unwrap().push(login);
                    if matches!(answer, LoginAnswer::Never) {
                        // Hold the login until the client goes away.
                        while read_message(&mut s).await.is_some() {}
                        return;
                    }
                    s.write_all(&packet(&login_answer(&answer))).await.unwrap();
                    // Logged in: answer every later request with a bare DONE,
                    // until the client goes away.
                    while read_message(&mut s).await.is_some() {
                        if s.write_all(&packet(&done(0))).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeTds { port, logins }
    }

    fn config(&self) -> tiberius::Config {
        plaintext(self.port).tiberius_config()
    }

    fn login_count(&self) -> usize {
        self.logins.lock().unwrap().len()
    }
}

fn plaintext(port: u16) -> SqlConnInfo {
    SqlConnInfo::parse(&format!(
        "Server=tcp:127.0.0.1,{port};Initial Catalog=orders;User ID=app;Password=S3cret!pw;Encrypt=DANGER_PLAINTEXT"
    ))
    .unwrap()
}

async fn server_error(number: u32, message: &'static str) -> tiberius::error::Error {
    let fake = FakeTds::start(LoginAnswer::Error(number, message)).await;
    match open_following_redirect(fake.config()).await {
        Err(e) => e,
        Ok(_) => panic!("login answered with error {number} succeeded"),
    }
}

// ------------------------------------------------ helpers shared by the modules

fn settings(connect_secs: u64) -> SqlServerSettings {
    SqlServerSettings {
        connect_timeout: Duration::from_secs(connect_secs),
        query_timeout: Duration::from_secs(2),
        pool_size: 2,
        migrate_timeout: order_guard::store::sqlserver::DEFAULT_MIGRATE_TIMEOUT,
        migrate_batch_rows: order_guard::store::sqlserver::DEFAULT_MIGRATE_BATCH_ROWS,
        idle_timeout: order_guard::store::sqlserver::DEFAULT_IDLE_TIMEOUT,
    }
}

fn order() -> Order {
    Order::from_data(&json!({
        "orderId": "o-1", "accountId": "a-1", "side": "buy", "symbol": "MSFT", "quantity": "1"
    }))
    .unwrap()
}
