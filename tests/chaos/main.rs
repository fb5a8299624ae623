//! `chaos`: runs the chaos scenarios of `docs/reliability.md` (`make chaos`), prints a table and writes
//! `target/chaos/report.json`. Exits 1 when any scenario failed a check.
//!
//! ```text
//! chaos [--short] [SCENARIO ...]     # default: every scenario, full size, then the findings' reproductions
//! CHAOS_SEED=42 chaos 1-kill9        # replay a run's random choices
//! ```

use std::process::ExitCode;

use batchd_tests::chaos::cluster::output_dir;
use batchd_tests::chaos::scenarios::{self, ALL, FINDINGS};
use batchd_tests::chaos::{Size, report};

#[tokio::main]
async fn main() -> ExitCode {
    let mut size = Size::Full;
    let mut names = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--short" => size = Size::Short,
            "--help" | "-h" => {
                println!(
                    "usage: chaos [--short] [SCENARIO ...]\nscenarios: {}\nreproductions of findings: {}",
                    ALL.join(" "),
                    FINDINGS.join(" ")
                );
                return ExitCode::SUCCESS;
            }
            name => names.push(name.to_owned()),
        }
    }
    if names.is_empty() {
        names = ALL.iter().chain(FINDINGS.iter()).map(|name| (*name).to_owned()).collect();
    }
    let machine = report::machine();
    eprintln!("chaos: {} scenarios, {} size, on {machine}", names.len(), size.as_str());
    let mut outcomes = Vec::new();
    let mut errors = Vec::new();
    let path = output_dir().join(format!("report{}.json", if size == Size::Short { "-short" } else { "" }));
    for name in &names {
        match scenarios::run(name, size).await {
            Ok(outcome) => {
                eprintln!("{}", outcome.explain());
                outcomes.push(outcome);
            }
            Err(error) => {
                eprintln!("scenario {name} could not run: {error:#}");
                errors.push(format!("{name}: {error:#}"));
            }
        }
        // Written after every scenario, so a long run leaves its figures even if stopped half-way.
        if let Err(error) = report::write_json(&path, &outcomes, machine.clone()) {
            eprintln!("cannot write {}: {error}", path.display());
        }
    }
    println!("\n{}", report::table(&outcomes));
    println!("{}", report::provider_table(&outcomes));
    println!("{}", report::markdown(&outcomes));
    println!("{}", report::provider_markdown(&outcomes));
    println!("report: {}", path.display());
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.passed()).map(|o| o.scenario.as_str()).collect();
    if failed.is_empty() && errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        for outcome in outcomes.iter().filter(|o| !o.passed()) {
            println!("{}", outcome.explain());
        }
        for error in &errors {
            println!("could not run: {error}");
        }
        ExitCode::FAILURE
    }
}
