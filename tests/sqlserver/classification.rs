//! Server errors classified by their real numbers.

use super::*;

// --------------------------------------------------- error classification

#[tokio::test]
async fn unique_violations_are_recognised_by_number_not_text() {
    for (number, text) in [
        (2627, "Violation of PRIMARY KEY constraint 'PK_Positions'."),
        (2601, "Cannot insert duplicate key row in object 'dbo.Orders' with unique index 'UX_Orders_OrderId'."),
        (2627, "duplicate key value violates unique constraint \"ux_orders_orderid\""),
    ] {
        let e = server_error(number, text).await;
        assert_eq!(e.code(), Some(number));
        assert!(classify::is_unique_violation(&e), "{number}");
    }
    let other = server_error(
        547,
        "The INSERT statement conflicted with the CHECK constraint",
    )
    .await;
    assert!(!classify::is_unique_violation(&other));
}

#[tokio::test]
async fn transient_numbers_ask_for_a_retry() {
    for number in [
        1205, 1222, 40613, 40501, 40197, 49918, 49919, 49920, 4060, 4221, 615, 926, 10928, 10929,
        233, 997, 1204,
    ] {
        let e = server_error(number, "try again").await;
        assert_eq!(e.code(), Some(number));
        match classify::classify("accept", &e) {
            StoreError::Transient(m) => assert!(m.contains(&number.to_string()), "{m}"),
            other => panic!("{number} classified as {other:?}"),
        }
    }
}

#[tokio::test]
async fn other_server_errors_are_permanent_with_the_server_text() {
    for (number, text) in [
        (18456, "Login failed for user 'app'."),
        (40544, "The database has reached its size quota."),
        (33557097, "feature not supported by this engine"),
    ] {
        let e = server_error(number, text).await;
        match classify::classify("accept", &e) {
            StoreError::Permanent(m) => {
                assert!(m.contains(&number.to_string()) && m.contains(text), "{m}")
            }
            other => panic!("{number} classified as {other:?}"),
        }
    }
}

/// A right or an object of the schema missing is no transient
/// failure (retrying fixes nothing) but a deployment fault whose message
/// says the fix, as SQL Server numbers it and as Babelfish words it.
#[tokio::test]
async fn permission_denied_and_missing_objects_are_misconfigurations_with_the_fix() {
    for (number, text, fix) in [
        (229, "The EXECUTE permission was denied on the object 'OrderGuard_Execute_v1', database 'orders', schema 'dbo'.", "ALTER ROLE order_guard_app ADD MEMBER"),
        (262, "CREATE TABLE permission denied in database 'orders'.", "ALTER ROLE order_guard_app ADD MEMBER"),
        (33557097, "permission denied for procedure orderguard_execute_v1", "ALTER ROLE order_guard_app ADD MEMBER"),
        (33557097, "permission denied for table rejectedevents", "ALTER ROLE order_guard_app ADD MEMBER"),
        (208, "Invalid object name 'dbo.Orders'.", "run `order-guard migrate` as the database admin"),
        (33557097, "relation \"orders_dbo.orders\" does not exist", "run `order-guard migrate` as the database admin"),
    ] {
        let e = server_error(number, text).await;
        let classified = classify::classify("execute", &e);
        assert!(classified.needs_operator(), "{classified:?}");
        match classified {
            StoreError::Misconfigured(m) => {
                assert!(m.contains(&number.to_string()) && m.contains(text), "{m}");
                assert!(m.contains(fix), "{m}");
                assert!(m.contains("docs/deploy.md step 4"), "{m}");
            }
            other => panic!("{number} classified as {other:?}"),
        }
    }
}

#[test]
fn dropped_connections_and_timeouts_are_transient() {
    let reset: tiberius::error::Error = std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "connection reset by peer",
    )
    .into();
    assert!(classify::is_connection_lost(&reset));
    assert!(matches!(
        classify::classify("execute", &reset),
        StoreError::Transient(_)
    ));
    let eof: tiberius::error::Error =
        std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed").into();
    assert!(matches!(
        classify::classify("execute", &eof),
        StoreError::Transient(_)
    ));
    assert!(matches!(
        classify::query_timeout("execute", Duration::from_secs(8)),
        StoreError::Transient(_)
    ));
    let pool = classify::pool_timeout(
        "accept",
        Duration::from_secs(10),
        Some("Login failed (18456)".into()),
    );
    match pool {
        StoreError::Transient(m) => assert!(m.contains("18456"), "{m}"),
        other => panic!("{other:?}"),
    }
    let conversion = tiberius::error::Error::Conversion("bad value".into());
    assert!(matches!(
        classify::classify("read", &conversion),
        StoreError::Permanent(_)
    ));
}
