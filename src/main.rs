//! The `order-guard` binary: the CLI over [`order_guard::app`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Subcommand};
use order_guard::app;
use order_guard::config::Config;

/// mimalloc: faster than glibc malloc on the many small allocations of the
/// request path (docs/benchmarks.md has the before/after).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Azure Functions custom handler that executes Event Grid orders exactly once
/// in effect. Configuration comes from the environment (see README).
#[derive(clap::Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Functions host on 127.0.0.1:$FUNCTIONS_CUSTOMHANDLER_PORT (default).
    Serve,
    /// Serve Event Grid's webhook protocol on 0.0.0.0:$WEBHOOK_PORT, where no
    /// Functions host runs (a container): deliveries authenticated with
    /// Microsoft Entra ID (WEBHOOK_TENANT_ID, WEBHOOK_AUDIENCE).
    Webhook,
    /// Create or upgrade the store's schema (idempotent).
    Migrate,
    /// Push a file of events through the processor, as Event Grid would deliver them.
    Replay {
        /// JSON array of deliveries (event objects, strings holding events, or arrays).
        file: PathBuf,
        /// How many deliveries are in flight at once (1 keeps the file's order).
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
    },
    /// Show an order's guard key beside its stored row.
    Status {
        /// The order id.
        order_id: String,
    },
    /// Remove this store's `COMPLETADA` keys whose order has no row in the
    /// database (after a restore to an earlier point), so those orders can
    /// execute again when redelivered.
    PruneGuard {
        /// List what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Announcements of executed orders (OUTBOX_STORAGE and OUTBOX_QUEUE, or
    /// OUTBOX_TOPIC_ENDPOINT): list the undispatched, send them again,
    /// dispatch now, or announce executions that have none.
    Outbox {
        #[command(subcommand)]
        action: OutboxAction,
    },
    /// Dead-lettered events in Blob Storage (DEAD_LETTER_STORAGE,
    /// DEAD_LETTER_CONTAINER): count them, or replay them through the processor.
    DeadLetters {
        #[command(subcommand)]
        action: DeadLetterAction,
    },
}

#[derive(Subcommand)]
enum OutboxAction {
    /// Counts, then every announcement not dispatched yet (parked ones,
    /// which wait for an operator, marked), oldest first.
    List,
    /// Make parked or waiting announcements due now (one, or all): the
    /// dispatchers of the running instances send them (or `outbox dispatch`).
    Retry {
        /// One announcement's message id (all when omitted).
        message_id: Option<String>,
    },
    /// Send what is due now from this process, once, to the destination
    /// this shell's settings name, and mark it sent. Without --yes, says
    /// where and how many, and does nothing.
    Dispatch {
        /// Send, and mark sent (the serving instances will not send them).
        #[arg(long)]
        yes: bool,
    },
    /// Make dispatched announcements due again, as they were (same id, same
    /// sequence), for the serving instances to send: one, or every one
    /// dispatched since a time (for a consumer that lost them). Without
    /// --yes, says how many and does nothing.
    Resend {
        /// One announcement's message id.
        #[arg(required_unless_present = "since", conflicts_with = "since")]
        message_id: Option<String>,
        /// Every one dispatched since this instant (RFC 3339, e.g.
        /// 2026-12-01T00:00:00Z) or this long ago (e.g. 36h, 7days).
        #[arg(long, value_parser = parse_since)]
        since: Option<std::time::Duration>,
        /// Make them due: consumers get a copy of each again.
        #[arg(long)]
        yes: bool,
    },
    /// Announce the orders executed since a time that have no announcement
    /// (executed by instances of an earlier version during a rolling
    /// upgrade), once each, for the serving instances to send. Without
    /// --yes, says how many and where they would go, and does nothing.
    Backfill {
        /// Executed since this instant (RFC 3339) or this long ago (e.g.
        /// 36h), at most OUTBOX_RETENTION_HOURS ago.
        #[arg(long, value_parser = parse_since)]
        since: std::time::Duration,
        /// Write the announcements: consumers get each once.
        #[arg(long)]
        yes: bool,
    },
}

/// `--since`: an RFC 3339 instant or an age, as the age of that instant.
fn parse_since(text: &str) -> Result<std::time::Duration, String> {
    if let Ok(age) = humantime::parse_duration(text) {
        return Ok(age);
    }
    let instant = humantime::parse_rfc3339_weak(text).map_err(|_| {
        format!("expected an instant (2026-12-01T00:00:00Z) or an age (36h, 7days), got {text:?}")
    })?;
    std::time::SystemTime::now()
        .duration_since(instant)
        .map_err(|_| format!("{text} is in the future"))
}

#[derive(Subcommand)]
enum DeadLetterAction {
    /// Counts by dead-letter reason and by the outcome a replay would get
    /// (read from the store, nothing executed or moved), oldest and newest.
    List(DeadLetterArgs),
    /// Push every dead-lettered event through the processor; move each blob
    /// whose events all got a final outcome under replayed/ (unreadable ones
    /// under unreadable/, after storing them as poison).
    Replay(DeadLetterArgs),
}

#[derive(clap::Args)]
struct DeadLetterArgs {
    /// Only blobs under this folder: a subscription (its name in upper case
    /// for topics), `<SUBSCRIPTION>/<yyyy>/<M>/<d>/<H>` for one hour, or
    /// `<namespace>/<topic>/<subscription>`.
    #[arg(long)]
    prefix: Option<String>,
    /// At most this many blobs.
    #[arg(long)]
    max_blobs: Option<usize>,
    /// Start no blob or event after this many seconds.
    #[arg(long)]
    deadline: Option<u64>,
    /// Run on the embedded defaults (in-memory guard, ./order-guard.db)
    /// when REDIS_URL or SQL_CONNECTION_STRING is unset; without it such a
    /// run is refused, since it would move production blobs away while
    /// their orders execute only in a local file.
    #[arg(long)]
    allow_embedded_state: bool,
}

impl DeadLetterArgs {
    fn options(&self) -> order_guard::deadletter::SweepOptions {
        order_guard::deadletter::SweepOptions {
            prefix: self.prefix.clone(),
            max_blobs: self.max_blobs,
            deadline: self.deadline.map(std::time::Duration::from_secs),
        }
    }
}

/// `--version`: this build's version and the SQL Server schema version it
/// needs (the one its `migrate` makes; `serve` answers `retry` on an older
/// one), so an operator can tell which binary runs on which database.
fn version() -> &'static str {
    let text = format!(
        "{} (schema version {})",
        env!("CARGO_PKG_VERSION"),
        order_guard::store::sqlserver::sql::SCHEMA_VERSION
    );
    Box::leak(text.into_boxed_str())
}

fn main() -> ExitCode {
    app::init_logging();
    order_guard::faults::setup_from_env();
    let cli = match Cli::command()
        .version(version())
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("order-guard: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("order-guard: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command.unwrap_or(Command::Serve), config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("order-guard: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve => app::serve(config).await?,
        Command::Webhook => app::webhook(config).await?,
        Command::Migrate => {
            let store = app::build_store(&config, app::NewFile::Created).await?;
            store.upgrade().await?;
            println!("schema is up to date ({})", app::describe(&config));
        }
        Command::Replay { file, concurrency } => {
            let deliveries = app::read_replay_file(&file)?;
            let telemetry = app::start_telemetry(&config)?;
            let processor = app::build_command_processor(&config, telemetry.as_ref()).await?;
            println!(
                "replaying {} deliveries from {} ({}, concurrency {concurrency})",
                deliveries.len(),
                file.display(),
                app::describe(&config)
            );
            let summary = app::replay(&processor, deliveries, concurrency).await;
            if let Some(t) = telemetry {
                t.shutdown().await;
            }
            println!("{summary}");
            if let Some(why) = &summary.stopped {
                eprintln!(
                    "order-guard: replay stopped: {why}; {} deliveries unresolved",
                    summary.unresolved
                );
                return Ok(ExitCode::FAILURE);
            }
            if summary.unresolved > 0 {
                eprintln!(
                    "order-guard: {} deliveries still need a retry",
                    summary.unresolved
                );
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Status { order_id } => {
            let status = app::status(&config, &order_id).await?;
            print!("{}", status.text);
            if !status.known {
                eprintln!("order-guard: the store has no order {order_id:?} and no rejected event naming it");
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Outbox {
            action: OutboxAction::List,
        } => print!("{}", app::outbox_list(&config).await?),
        Command::Outbox {
            action: OutboxAction::Retry { message_id },
        } => {
            let n = app::outbox_retry(&config, message_id.as_deref()).await?;
            println!("{n} announcements due now");
        }
        Command::Outbox {
            action: OutboxAction::Dispatch { yes },
        } => match app::outbox_dispatch(&config, yes).await? {
            app::DispatchRun::Sent(n) => println!("{n} announcements dispatched"),
            app::DispatchRun::Plan(plan) => {
                println!("{plan}");
                eprintln!("order-guard: nothing sent: run `order-guard outbox dispatch --yes` to send them");
                return Ok(ExitCode::from(2));
            }
        },
        Command::Outbox {
            action:
                OutboxAction::Resend {
                    message_id,
                    since,
                    yes,
                },
        } => {
            let which = match (message_id, since) {
                (Some(id), _) => order_guard::store::Resend::Message(id),
                (None, Some(age)) => order_guard::store::Resend::DispatchedWithin(age),
                (None, None) => unreachable!("clap requires one"),
            };
            let n = app::outbox_resend(&config, &which, yes).await?;
            if !yes {
                let what = match &which {
                    order_guard::store::Resend::Message(id) => {
                        format!("{n} dispatched announcement with the id {id}")
                    }
                    order_guard::store::Resend::DispatchedWithin(age) => format!(
                        "the announcements dispatched in the last {} (of {n} dispatched kept)",
                        humantime::format_duration(std::time::Duration::from_secs(age.as_secs()))
                    ),
                };
                println!(
                    "would make {what} due again, for the serving instances to send with the same ids and sequences"
                );
                eprintln!("order-guard: nothing changed: run again with --yes to resend them");
                return Ok(ExitCode::from(2));
            }
            println!("{n} announcements due again, for the serving instances to send");
        }
        Command::Outbox {
            action: OutboxAction::Backfill { since, yes },
        } => match app::outbox_backfill(&config, since, yes).await? {
            app::BackfillRun::Written(n) => {
                println!("{n} announcements written, for the serving instances to send")
            }
            app::BackfillRun::Plan(plan) => {
                println!("{plan}");
                eprintln!("order-guard: nothing written: run again with --yes to announce them");
                return Ok(ExitCode::from(2));
            }
        },
        Command::PruneGuard { dry_run } => {
            let summary = app::prune_guard(&config, dry_run).await?;
            println!("{summary}");
        }
        Command::DeadLetters {
            action: DeadLetterAction::List(args),
        } => print!(
            "{}",
            app::dead_letters_list(&config, &args.options(), args.allow_embedded_state).await?
        ),
        Command::DeadLetters {
            action: DeadLetterAction::Replay(args),
        } => {
            let summary =
                app::dead_letters_replay(&config, &args.options(), args.allow_embedded_state)
                    .await?;
            for left in &summary.left {
                println!("left {left}");
            }
            println!("{summary}");
            let mut failed = false;
            if let Some(why) = &summary.stopped {
                eprintln!(
                    "order-guard: dead-letters replay stopped: {why}; {} blobs not reached stay where they are",
                    summary.not_reached
                );
                failed = true;
            }
            if summary.unresolved > 0 {
                eprintln!(
                    "order-guard: {} dead-letter blobs stay for the next replay (reasons above)",
                    summary.unresolved
                );
                failed = true;
            }
            if summary.unreadable > 0 {
                eprintln!(
                    "order-guard: {} dead-letter blobs held no events or were too large: set aside under unreadable/, each stored in RejectedEvents with its reason (order-guard status, or the table)",
                    summary.unreadable
                );
                failed = true;
            }
            if failed {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
