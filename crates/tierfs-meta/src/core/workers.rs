//! The workers domain: reports of the clients' background workers (`tierfs status`). Each
//! client replaces its session's rows every few seconds; rows of ended sessions go at the next
//! report of any client, and are never read (only live sessions' rows are).

use super::SqlMeta;
use crate::engine::Workers;
use crate::error::{MetaError, Result};
use crate::sql::Driver;
use crate::types::*;
use crate::vals;

/// Schema v6: one row per worker of each live client session.
pub const SCHEMA: super::schema::Ddl = &["CREATE TABLE worker_reports (
        session INT NOT NULL,
        pos INT NOT NULL,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        progress TEXT NOT NULL,
        runs INT NOT NULL,
        errors INT NOT NULL,
        last_run INT NOT NULL,
        last_error TEXT,
        last_error_at INT NOT NULL,
        reported INT NOT NULL,
        PRIMARY KEY (session, pos)
    )"];

impl<D: Driver> Workers for SqlMeta<D> {
    fn report_workers(&self, session: u64, reports: &[WorkerReport]) -> Result<()> {
        self.d.write(|tx| {
            if !tx.exists(
                "SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $1)",
                vals![session],
            )? {
                return Err(MetaError::Invalid(format!("session {session} has ended")));
            }
            tx.exec(
                "DELETE FROM worker_reports WHERE session = $1 \
                 OR session NOT IN (SELECT id FROM sessions)",
                vals![session],
            )?;
            for (pos, r) in reports.iter().enumerate() {
                tx.exec(
                    "INSERT INTO worker_reports (session, pos, name, state, progress, runs, \
                     errors, last_run, last_error, last_error_at, reported) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    vals![
                        session,
                        pos as i64,
                        r.name.as_str(),
                        r.state.as_str(),
                        r.progress.as_str(),
                        r.runs,
                        r.errors,
                        r.last_run,
                        r.last_error.as_deref(),
                        r.last_error_at,
                        r.reported
                    ],
                )?;
            }
            Ok(())
        })
    }

    fn worker_reports(&self) -> Result<Vec<WorkerReport>> {
        self.d.read(|tx| {
            tx.query(
                "SELECT w.session, w.name, w.state, w.progress, w.runs, w.errors, w.last_run, \
                 w.last_error, w.last_error_at, w.reported \
                 FROM worker_reports w JOIN sessions s ON s.id = w.session \
                 ORDER BY w.session, w.pos",
                vals![],
            )?
            .into_iter()
            .map(|r| {
                Ok(WorkerReport {
                    session: r.u64(0)?,
                    name: r.text(1)?,
                    state: r.text(2)?,
                    progress: r.text(3)?,
                    runs: r.u64(4)?,
                    errors: r.u64(5)?,
                    last_run: r.i64(6)?,
                    last_error: r.opt_text(7)?,
                    last_error_at: r.i64(8)?,
                    reported: r.i64(9)?,
                })
            })
            .collect()
        })
    }
}
