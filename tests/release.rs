//! What a release says of itself: `order-guard --version` names the build's
//! version and the SQL Server schema version it needs (the one its
//! `migrate` makes), CHANGELOG.md has a section for that version naming the
//! same schema version, and the LICENSE is the one Cargo.toml declares.

use std::process::Command;

use order_guard::store::sqlserver::sql::SCHEMA_VERSION;

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn version_prints_the_version_and_the_schema_version_it_needs() {
    for flag in ["--version", "-V"] {
        let out = Command::new(env!("CARGO_BIN_EXE_order-guard"))
            .arg(flag)
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success(), "{flag}: {out:?}");
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!(
                "order-guard {} (schema version {SCHEMA_VERSION})\n",
                env!("CARGO_PKG_VERSION")
            ),
            "{flag}"
        );
    }
}

#[test]
fn the_changelog_has_this_version_and_its_schema_version() {
    let changelog = read("CHANGELOG.md");
    let heading = format!("\n## {}", env!("CARGO_PKG_VERSION"));
    let section = changelog
        .split(&heading)
        .nth(1)
        .unwrap_or_else(|| panic!("CHANGELOG.md has no section {heading:?}"))
        .split("\n## ")
        .next()
        .unwrap();
    assert!(
        section.contains(&format!("Schema version {SCHEMA_VERSION}")),
        "CHANGELOG.md's {} section does not name schema version {SCHEMA_VERSION}",
        env!("CARGO_PKG_VERSION")
    );
}

#[test]
fn the_license_is_the_one_cargo_declares() {
    let manifest = read("Cargo.toml");
    assert!(manifest.contains("\nlicense = \"MIT\"\n"));
    let license = read("LICENSE");
    assert!(license.starts_with("MIT License\n"));
    assert!(license.contains("Copyright (c) the order-guard authors"));
}
