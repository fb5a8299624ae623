//! The dashboard's HTML, rendered from the JSON the pages' twins answer (so a page can show nothing its JSON does
//! not hold). maud escapes every value for HTML; on top of that, text from producers and the API goes through
//! [`shown`], which makes control and bidi characters visible (`\u{202e}`) and cuts long values, as the CLI does.
//!
//! Long because it holds the markup of every page, one function each, all sharing the layout and the escaping
//! helpers at the top.

use std::time::Duration;

use axum::http::StatusCode;
use batchd_core::ledger::field;
use maud::{DOCTYPE, Markup, html};
use serde_json::Value;

use super::Frame;
use super::data::{ITEMS_PAGE, RESPONSES_PAGE, Range, STATUSES};

use crate::cli::{escape_for_terminal, format_age, format_utc};

/// Most characters of one value a page shows (the JSON twin has the whole value).
const MAX_SHOWN: usize = 300;

/// `text` safe to show: control and bidi characters escaped, cut to `max` characters.
fn shown(text: &str, max: usize) -> String {
    let cut: String = text.chars().take(max).collect();
    let ellipsis = if cut.len() < text.len() { "…" } else { "" };
    format!("{}{ellipsis}", escape_for_terminal(&cut))
}

/// A JSON value as text: strings as they are, numbers, `-` for null or absent.
fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => shown(text, MAX_SHOWN),
        other => shown(&other.to_string(), MAX_SHOWN),
    }
}

/// Unix ms as an RFC 3339 time, `-` when absent.
fn time(value: &Value) -> String {
    value.as_u64().map(format_utc).unwrap_or_else(|| "-".to_owned())
}

/// A size in bytes for people: `76.0 MiB (79,691,776 bytes)`; `-` for anything but a number.
fn size(value: &Value) -> String {
    let Some(bytes) = value.as_u64() else { return "-".to_owned() };
    let digits = bytes.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    match bytes {
        0..1024 => format!("{grouped} bytes"),
        1024..1_048_576 => format!("{:.1} KiB ({grouped} bytes)", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB ({grouped} bytes)", bytes as f64 / 1_048_576.0),
    }
}

/// Milliseconds as an age (`4m05s`), `-` when absent.
fn age(value: &Value) -> String {
    value.as_u64().map(|ms| format_age(Duration::from_millis(ms))).unwrap_or_else(|| "-".to_owned())
}

/// A link inside the dashboard, keeping the namespace.
fn link(frame: &Frame<'_>, path: &str) -> String {
    let separator = if path.contains('?') { '&' } else { '?' };
    format!("{path}{separator}ns={}", encode(frame.namespace))
}

/// What a path segment or query value keeps as it is: letters, digits and `-._` (job ids read naturally).
const COMPONENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_');

/// `text` for a URL's path segment or query value.
pub(crate) fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, COMPONENT).to_string()
}

/// The page around `body`: navigation, namespace switcher, notice, and the refresh hook.
fn layout(frame: &Frame<'_>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "batchd · " (title) " · " (frame.namespace) }
                link rel="stylesheet" href="/assets/ui.css";
                script src="/assets/ui.js" defer {}
            }
            body data-refresh-secs=(frame.refresh_secs) {
                header {
                    nav {
                        a.brand href=(link(frame, "/")) { "batchd" }
                        a href=(link(frame, "/")) { "Overview" }
                        a href=(link(frame, "/jobs")) { "Jobs" }
                        a href=(link(frame, "/failed")) { "Failed jobs" }
                        a href=(link(frame, "/dead")) { "Dead letters" }
                    }
                    div.meta {
                        span { "namespace " }
                        @for namespace in &frame.namespaces {
                            @if *namespace == frame.namespace {
                                strong.ns { (namespace) }
                            } @else {
                                a.ns href=(format!("/?ns={}", encode(namespace))) { (namespace) }
                            }
                        }
                        span #mode { @if frame.token.is_some() { "actions allowed" } @else { "read-only" } }
                        @if frame.refresh_secs > 0 {
                            label { input #auto-refresh type="checkbox" checked; " refresh every " (frame.refresh_secs) " s" }
                        }
                    }
                }
                main #content {
                    @if let Some(notice) = frame.notice {
                        p #notice.notice data-notice=(notice.code()) { (notice.text()) }
                    }
                    (body)
                }
            }
        }
    }
}

/// A page for an error (404, 403, Redis down).
pub fn error_page(status: StatusCode, message: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "batchd · " (status) } link rel="stylesheet" href="/assets/ui.css"; }
            body { main #content { h1 { (status) } p #error.error { (shown(message, 2_000)) } p { a href="/" { "Overview" } } } }
        }
    }
}

/// Seconds between the "Redis unreachable" page's retries, whatever `--refresh-secs` says.
pub const UNAVAILABLE_RETRY_SECS: u64 = 3;

/// The page while Redis cannot be reached (503): what happened, and a retry every [`UNAVAILABLE_RETRY_SECS`] by
/// the script, which loads the page the operator asked for as soon as it answers again.
pub fn unavailable_page(message: &str) -> Markup {
    retrying_page(
        "unavailable",
        "Redis unreachable",
        "The dashboard is up, but the Redis it reads does not answer; this page tries again every",
        "and shows the page as soon as Redis is back.",
        message,
    )
}

/// The page when an expensive page waited too long for its turn (503, see `ui::EXPENSIVE_AT_ONCE`): what happened,
/// and a retry every [`UNAVAILABLE_RETRY_SECS`] by the script, as [`unavailable_page`].
pub fn busy_page(message: &str) -> Markup {
    retrying_page(
        "busy",
        "Dashboard busy",
        "The dashboard serves a few pages that read much at a time, and others were ahead of this one; this page \
         tries again every",
        "and shows the page as soon as its turn comes.",
        message,
    )
}

/// A 503 page that the script loads again every [`UNAVAILABLE_RETRY_SECS`] until it answers: heading `title` (with
/// the id `id`), a sentence around the retry interval, and the error.
fn retrying_page(id: &str, title: &str, before: &str, after: &str, message: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "batchd · " (title) }
                link rel="stylesheet" href="/assets/ui.css";
                script src="/assets/ui.js" defer {}
            }
            body data-unavailable="" data-refresh-secs=(UNAVAILABLE_RETRY_SECS) {
                main #content {
                    h1 id=(id) { (title) }
                    p { (before) " " (UNAVAILABLE_RETRY_SECS) " s " (after) }
                    p #error.error { (shown(message, 2_000)) }
                }
            }
        }
    }
}

/// A form that posts an action on the page's namespace (nothing when actions are off).
fn action(frame: &Frame<'_>, path: &str, label: &str, id: &str, confirm: &str) -> Markup {
    action_form(frame, frame.namespace, path, label, id, confirm, html! {})
}

/// A form that posts an action on namespace `ns` with the session's token, its own `fields` (inputs) before the
/// button; nothing when actions are off. With `confirm`, the script asks first.
fn action_form(
    frame: &Frame<'_>,
    ns: &str,
    path: &str,
    label: &str,
    id: &str,
    confirm: &str,
    fields: Markup,
) -> Markup {
    let Some(token) = frame.token else { return html! {} };
    html! {
        form.action method="post" action=(path) data-confirm=(confirm) {
            input type="hidden" name="token" value=(token);
            input type="hidden" name="ns" value=(ns);
            (fields)
            button id=(id) type="submit" { (label) }
        }
    }
}

/// The overview: every namespace's depths, chunk states, finished jobs over the chosen range, consumers, tokens
/// and cost per day; with actions, pause or resume per namespace.
pub fn overview(frame: &Frame<'_>, value: &Value) -> Markup {
    let body = html! {
        h1 { "Overview" }
        @for ns in value["namespaces"].as_array().into_iter().flatten() {
            (namespace_overview(frame, ns))
        }
        p.updated { "Redis time " (time(&value["at"])) }
    };
    layout(frame, "Overview", body)
}

fn namespace_overview(frame: &Frame<'_>, ns: &Value) -> Markup {
    let name = ns["namespace"].as_str().unwrap_or("");
    let stats = &ns["stats"];
    let workers = &ns["workers"];
    let chunks = &ns["chunks"];
    let jobs_link = |state: &str| format!("/jobs?ns={}&state={state}", encode(name));
    html! {
        section.namespace id=(format!("ns-{name}")) {
            h2 { "Namespace " (name) }
            @if stats["paused"].is_null() {
                (action_form(frame, name, "/pause", "Pause intake", &format!("pause-{name}"),
                    &format!("Pause intake of namespace {name}? Replicas stop reading the submit stream and finish the jobs they have."),
                    html! { input type="text" name="reason" placeholder="reason (optional)" size="24" maxlength="200"; }))
            } @else {
                p.warning.paused id=(format!("paused-{name}")) {
                    "Intake paused by " (text(&stats["paused"]["by"])) " at " (time(&stats["paused"]["at"]))
                    @if let Some(reason) = stats["paused"]["reason"].as_str() { ": " (shown(reason, 200)) }
                }
                (action_form(frame, name, "/resume", "Resume intake", &format!("resume-{name}"), "", html! {}))
            }
            div.cards {
                (card("waiting", "Waiting", &stats["submit"]["waiting"], None))
                (card("taking-in", "Being taken in", &stats["submit"]["in_flight"], None))
                (card("in-flight", "Chunks in flight", &stats["schedule"]["chunks_in_flight"], Some(jobs_link("running"))))
                (card("due", "Due now", &stats["schedule"]["due"], None))
                (card("dead", "Dead letters", &stats["dead"]["entries"], Some(format!("/dead?ns={}", encode(name)))))
                div.card { div.label { "Oldest waiting" } div.value id=(format!("oldest-{name}")) { (age(&stats["submit"]["oldest_waiting_ms"])) } }
                div.card { div.label { "Schedule lag" } div.value { (age(&stats["schedule"]["lag_ms"])) } }
            }
            h3 { "Chunks in flight by state" }
            @if chunks["of"] == 0 {
                p.note { "None: nothing is submitted or waiting for a poll." }
            } @else {
            p.note { "The " (text(&chunks["sampled"])) " soonest due of " (text(&chunks["of"])) " scheduled chunks." }
            table.chunk-states {
                thead { tr { th { "state" } th { "chunks" } } }
                tbody {
                    @for (state, n) in chunks["by_state"].as_object().into_iter().flatten() {
                        tr { td { (shown(state, 40)) } td.num { (text(n)) } }
                    }
                }
            }
            }
            (finished(frame, name, &ns["finished"]))
            h3 { "Replicas reading the submit stream" }
            @let consumers = workers["consumers"].as_array().cloned().unwrap_or_default();
            @if consumers.is_empty() {
                p.note { "No consumer in group " (text(&workers["group"])) " yet: no replica has started here." }
            } @else {
                table.consumers {
                    thead { tr { th { "consumer" } th { "holding" } th { "idle" } } }
                    tbody {
                        @for consumer in &consumers {
                            tr { td { (text(&consumer["name"])) } td.num { (text(&consumer["pending"])) } td { (age(&consumer["idle_ms"])) } }
                        }
                    }
                }
            }
            h3 { "Tokens by model" }
            (tokens(&ns["tokens"]))
            h3 { "Cost per day" }
            (cost(name, &stats["cost"]["days"]))
        }
    }
}

/// What finished jobs cost per UTC day and provider at their models' batch prices (`stats --json`'s `cost.days`),
/// newest day first; days with no cost are left out.
fn cost(name: &str, days: &Value) -> Markup {
    let days: Vec<&Value> =
        days.as_array().into_iter().flatten().rev().filter(|day| day["total"].as_f64().unwrap_or(0.0) > 0.0).collect();
    let mut providers: Vec<String> = days
        .iter()
        .flat_map(|day| day["by_provider"].as_object().into_iter().flatten().map(|(provider, _)| provider.clone()))
        .collect();
    providers.sort();
    providers.dedup();
    let usd = |value: &Value| value.as_f64().map_or_else(|| "–".to_owned(), crate::cli::cost::format_usd);
    html! {
        @if days.is_empty() {
            p.note id=(format!("cost-{name}")) { "No cost in the last 7 days: no finished job's model has a price (docs/cost.md)." }
        } @else {
            table.cost id=(format!("cost-{name}")) {
                thead { tr { th { "day (UTC)" } th { "total" } @for provider in &providers { th { (shown(provider, 40)) } } } }
                tbody {
                    @for day in &days {
                        tr data-day=(day["day"].as_str().unwrap_or("")) {
                            td { (text(&day["day"])) }
                            td.num.total { (usd(&day["total"])) }
                            @for provider in &providers {
                                td.num data-provider=(provider) { (usd(&day["by_provider"][provider.as_str()])) }
                            }
                        }
                    }
                }
            }
            p.note { "At the models' batch prices (docs/cost.md); a packed Workers AI job's share is estimated." }
        }
    }
}

fn card(id: &str, label: &str, value: &Value, href: Option<String>) -> Markup {
    html! {
        div.card {
            div.label { (label) }
            @if let Some(href) = href {
                a.value id=(id) href=(href) { (text(value)) }
            } @else {
                div.value id=(id) { (text(value)) }
            }
        }
    }
}

/// Finished jobs over the chosen range as stacked bars by status (inline SVG) with a time axis and a jobs axis,
/// the range switch (1 h by minute, 24 h and 8 d by hour: links, so it works without the script), and the range's
/// totals by status.
fn finished(frame: &Frame<'_>, name: &str, finished: &Value) -> Markup {
    let range = Range::parse(finished["range"].as_str());
    let buckets = finished["buckets"].as_array().cloned().unwrap_or_default();
    let count = |row: &Value, status: &str| row[status].as_u64().unwrap_or(0);
    let peak = buckets.iter().map(|row| STATUSES.iter().map(|s| count(row, s)).sum::<u64>()).max().unwrap_or(0);
    let axis = Axis::new(range, peak, buckets.len());
    let (left, right, top, bottom) = (Axis::LEFT, Axis::WIDTH - Axis::RIGHT, Axis::TOP, Axis::HEIGHT - Axis::BOTTOM);
    let unit = if range == Range::Hour { "jobs/min" } else { "jobs/h" };
    let title = match range {
        Range::Hour => "Finished in the last hour",
        Range::Day => "Finished in the last 24 hours",
        Range::EightDays => "Finished in the last 8 days",
    };
    html! {
        h3 { (title) }
        p.range id=(format!("range-{name}")) {
            "show "
            @for choice in Range::ALL {
                @if choice == range {
                    strong data-range=(choice.code()) { (choice.code()) }
                } @else {
                    a data-range=(choice.code()) href=(format!("/?ns={}&range={}#ns-{}", encode(frame.namespace), choice.code(), encode(name))) { (choice.code()) }
                }
                " "
            }
        }
        div.finished {
            table.totals id=(format!("finished-{name}")) data-range=(range.code()) {
                tr {
                    @for status in STATUSES {
                        td class=(format!("status-{status}")) {
                            span.label { (status) } " "
                            span.value data-status=(status) { (buckets.iter().map(|row| count(row, status)).sum::<u64>()) }
                        }
                    }
                }
            }
            svg.chart id=(format!("chart-{name}")) data-range=(range.code()) viewBox=(format!("0 0 {} {}", Axis::WIDTH, Axis::HEIGHT)) width="100%" role="img" {
                title { (title) ", " (unit) " by status (peak " (peak) ")" }
                // The jobs axis: a line at 0, half and the top of the scale, each labelled.
                @for tick in axis.y_ticks() {
                    @let y = axis.y(tick);
                    line.grid x1=(left) x2=(right) y1=(format!("{y:.1}")) y2=(format!("{y:.1}")) {}
                    text.tick.y-tick x=(left - 4.0) y=(format!("{:.1}", y + 3.5)) text-anchor="end" { (tick) }
                }
                text.axis-title.y-title x="10" y=(format!("{:.1}", (top + bottom) / 2.0)) text-anchor="middle" transform=(format!("rotate(-90 10 {:.1})", (top + bottom) / 2.0)) { (unit) }
                @for (i, row) in buckets.iter().enumerate() {
                    @let mut y = bottom;
                    @let at = row["at"].as_u64().unwrap_or(0);
                    @for status in STATUSES {
                        @let n = count(row, status);
                        @if n > 0 {
                            @let h = bottom - axis.y(n);
                            @let top_of_bar = { y -= h; y };
                            rect class=(format!("status-{status}")) x=(format!("{:.2}", axis.x(i))) y=(format!("{top_of_bar:.1}")) width=(format!("{:.2}", (axis.bar() - 0.6).max(0.6))) height=(format!("{h:.1}")) {
                                title { (format_utc(at)) ": " (n) " " (status) }
                            }
                        }
                    }
                    // The time axis: a tick and a label at each round time (every 15 minutes, 6 hours or day).
                    @if at.is_multiple_of(axis.label_every_ms) {
                        line.axis x1=(format!("{:.2}", axis.x(i))) x2=(format!("{:.2}", axis.x(i))) y1=(bottom) y2=(bottom + 4.0) {}
                        text.tick.x-tick x=(format!("{:.2}", axis.x(i))) y=(bottom + 15.0) text-anchor="middle" { (axis.label(at)) }
                    }
                }
                line.axis x1=(left) x2=(right) y1=(bottom) y2=(bottom) {}
                line.axis x1=(left) x2=(left) y1=(top) y2=(bottom) {}
                text.axis-title.x-title x=(right) y=(Axis::HEIGHT - 1.0) text-anchor="end" { "time (UTC)" }
            }
        }
    }
}

/// The chart's geometry and scales: bars left to right, one per bucket; the jobs scale rounded up to a round
/// number so its labels are whole.
#[derive(Debug, Clone, Copy)]
struct Axis {
    /// The top of the jobs scale (1, 2 or 5 times a power of ten, at least the peak).
    scale: u64,
    /// How many bars.
    n: usize,
    /// A time label at each multiple of this (ms).
    label_every_ms: u64,
    /// How the labels read: `HH:MM`, or `MM-DD` for days.
    days: bool,
}

impl Axis {
    /// The SVG's size and the plot's margins (room for the labels).
    const WIDTH: f64 = 640.0;
    const HEIGHT: f64 = 150.0;
    const LEFT: f64 = 44.0;
    const RIGHT: f64 = 8.0;
    const TOP: f64 = 8.0;
    const BOTTOM: f64 = 30.0;

    fn new(range: Range, peak: u64, n: usize) -> Self {
        let label_every_ms = match range {
            Range::Hour => 15 * 60_000,
            Range::Day => 6 * 3_600_000,
            Range::EightDays => 24 * 3_600_000,
        };
        Self { scale: round_up(peak), n: n.max(1), label_every_ms, days: range == Range::EightDays }
    }

    /// Width of one bar's slot.
    fn bar(&self) -> f64 {
        (Self::WIDTH - Self::LEFT - Self::RIGHT) / self.n as f64
    }

    /// Left edge of bar `i`.
    fn x(&self, i: usize) -> f64 {
        Self::LEFT + i as f64 * self.bar()
    }

    /// Height on the plot of `n` jobs.
    fn y(&self, n: u64) -> f64 {
        let bottom = Self::HEIGHT - Self::BOTTOM;
        bottom - n as f64 / self.scale as f64 * (bottom - Self::TOP)
    }

    /// The labelled values of the jobs axis: 0, the half when whole, the top.
    fn y_ticks(&self) -> Vec<u64> {
        let mut ticks = vec![0];
        if self.scale.is_multiple_of(2) {
            ticks.push(self.scale / 2);
        }
        ticks.push(self.scale);
        ticks
    }

    /// A time label: `HH:MM` (UTC), or `MM-DD` on the 8-day chart.
    fn label(&self, at: u64) -> String {
        let utc = format_utc(at); // 2025-11-22T08:15:00.000Z
        if self.days { utc.get(5..10) } else { utc.get(11..16) }.unwrap_or("").to_owned()
    }
}

/// The smallest of 1, 2 and 5 times a power of ten that is at least `n` (1 for 0).
fn round_up(n: u64) -> u64 {
    let mut power = 1u64;
    loop {
        for step in [1u64, 2, 5] {
            let candidate = step.saturating_mul(power);
            if candidate >= n {
                return candidate;
            }
        }
        power = power.saturating_mul(10);
    }
}

fn tokens(tokens: &Value) -> Markup {
    let hour = tokens["last_hour"].as_object().cloned().unwrap_or_default();
    let day = tokens["last_day"].as_object().cloned().unwrap_or_default();
    let number = |value: Option<&Value>, kind: &str| value.and_then(|v| v[kind].as_u64()).unwrap_or(0);
    html! {
        @if day.is_empty() {
            p.note { "No token usage reported in the last day." }
        } @else {
            table.tokens {
                thead { tr { th { "model" } th { "prompt, hour" } th { "completion, hour" } th { "prompt, day" } th { "completion, day" } } }
                tbody {
                    @for (model, usage) in &day {
                        tr {
                            td { (shown(model, 80)) }
                            td.num { (number(hour.get(model), "prompt")) }
                            td.num { (number(hour.get(model), "completion")) }
                            td.num { (number(Some(usage), "prompt")) }
                            td.num { (number(Some(usage), "completion")) }
                        }
                    }
                }
            }
        }
    }
}

/// The jobs list's current filters, to fill the form again.
#[derive(Debug)]
pub struct JobsFilters<'a> {
    /// A job state, or empty.
    pub state: &'a str,
    /// A model, or empty.
    pub model: &'a str,
    /// A provider, or empty.
    pub provider: &'a str,
    /// A job id prefix, or empty.
    pub prefix: &'a str,
    /// An age (`30m`), or empty.
    pub since: &'a str,
}

/// The jobs list: filters, one page of ledgers, and the link to the next page.
pub fn jobs(frame: &Frame<'_>, filters: &JobsFilters<'_>, page: &Value) -> Markup {
    let states = ["", "accepted", "running", "completed", "failed", "expired", "cancelled"];
    let next = page["next_cursor"].as_u64().map(|cursor| {
        format!(
            "/jobs?ns={}&state={}&model={}&provider={}&prefix={}&since={}&cursor={cursor}",
            encode(frame.namespace),
            encode(filters.state),
            encode(filters.model),
            encode(filters.provider),
            encode(filters.prefix),
            encode(filters.since)
        )
    });
    let body = html! {
        h1 { "Jobs" }
        form #filters.filters method="get" action="/jobs" {
            input type="hidden" name="ns" value=(frame.namespace);
            label { "state " select name="state" {
                @for state in states {
                    option value=(state) selected[state == filters.state] { @if state.is_empty() { "any" } @else { (state) } }
                }
            } }
            label { "model " input type="text" name="model" value=(filters.model) placeholder="@cf/baai/bge-m3"; }
            label { "provider " input type="text" name="provider" value=(filters.provider) placeholder="openai" size="10"; }
            label { "id prefix " input type="text" name="prefix" value=(filters.prefix); }
            label { "accepted within " input type="text" name="since" value=(filters.since) placeholder="2h" size="5"; }
            button type="submit" { "Filter" }
        }
        form #remote-lookup.filters method="get" action="/jobs" {
            input type="hidden" name="ns" value=(frame.namespace);
            label { "remote batch id " input type="text" name="remote" placeholder="batch_6740…" size="28"; }
            button type="submit" { "Find its job" }
        }
        p.note #page-note {
            (text(&page["matching"])) " matching of " (text(&page["scanned"])) " ledgers read on this page"
            @if next.is_none() { " (the walk is complete)" }
            "; newest first within the page."
        }
        table #jobs.jobs {
            thead { tr { th { "job" } th { "state" } th { "provider" } th { "model" } th { "items" } th { "chunks" } th { "accepted" } th { "updated" } th { "duration" } } }
            tbody {
                @for job in page["jobs"].as_array().into_iter().flatten() {
                    @let id = job["job_id"].as_str().unwrap_or("");
                    tr {
                        td { a.job-link href=(link(frame, &format!("/jobs/{}", encode(id)))) { (shown(id, 120)) } }
                        td { span class=(format!("state state-{}", job["state"].as_str().unwrap_or(""))) { (text(&job["state"])) } }
                        td.provider { (text(&job["provider"])) }
                        td { (text(&job["model"])) }
                        td.num { (text(&job["n_items"])) }
                        td.num { (text(&job["n_chunks"])) }
                        td { (time(&job["accepted_at"])) }
                        td { (time(&job["updated_at"])) }
                        td.duration title=(if job["finished_at"].is_null() { "so far" } else { "accepted to finished" }) { (age(&job["duration_ms"])) }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a #next-page href=(next) { "Next page →" } }
        }
    };
    layout(frame, "Jobs", body)
}

/// What cancelling a job of `model` does, as its confirmation says, from its provider kind's capabilities (the
/// registry): a provider that can cancel has its batches cancelled; at one that cannot (Workers AI), they run on
/// and their results are discarded.
fn cancel_confirmation(model: &str) -> String {
    match crate::registry::kind_of(model) {
        Some(kind) if kind.capabilities.cancel => format!(
            "Cancel this job? Batches already submitted are cancelled at {}; the result keeps what had finished.",
            kind.title
        ),
        Some(kind) => format!(
            "Cancel this job? {} has no remote cancel: batches already submitted keep running there; their results are discarded.",
            kind.title
        ),
        None => "Cancel this job? Batches already submitted are cancelled at their provider where it can cancel; otherwise their results are discarded.".to_owned(),
    }
}

/// One job: its ledger, chunks, timeline, and result with responses paged.
pub fn job(frame: &Frame<'_>, value: &Value) -> Markup {
    let job = &value["job"];
    let id = job["job_id"].as_str().unwrap_or("");
    let state = job[field::STATE].as_str().unwrap_or("");
    let terminal = state.parse::<batchd_core::JobState>().is_ok_and(batchd_core::JobState::is_terminal);
    // `status --json` gives a number as text or as a number: either reads.
    let number = |value: &Value| value.as_u64().or_else(|| value.as_str().and_then(|n| n.parse::<u64>().ok()));
    let n_chunks = number(&job[field::N_CHUNKS]).and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let chunk = |index: u32, name: &str| &job[field::chunk(index, name)];
    let mut timeline: Vec<(u64, String)> = Vec::new();
    if let Some(at) = number(&job[field::ACCEPTED_AT]) {
        timeline.push((at, "accepted".to_owned()));
    }
    for index in 0..n_chunks {
        if let Some(at) = number(chunk(index, field::CHUNK_SUBMITTED_AT)) {
            let polls = number(chunk(index, field::CHUNK_N_POLLS)).unwrap_or(0);
            timeline.push((
                at,
                format!(
                    "chunk {index} submitted (request {}); {polls} polls since",
                    text(chunk(index, field::CHUNK_REQUEST_ID))
                ),
            ));
        }
    }
    if let Some(at) = number(&job[field::FINISHED_AT]) {
        timeline.push((at, format!("finished {state}")));
    } else if let Some(at) = number(&job[field::UPDATED_AT]) {
        timeline.push((at, "last change".to_owned()));
    }
    timeline.sort();
    let result = &value["result"];
    let paging = &value["responses_page"];
    let every_item_failed = state == "completed"
        && number(&result["items_total"])
            .is_some_and(|total| total > 0 && number(&result["items_failed"]) == Some(total));
    let body = html! {
        h1 { "Job " span #job-id { (shown(id, 120)) } }
        p {
            // A completed job whose every item failed keeps `completed` (wire format v1) but is not shown as a success.
            @if every_item_failed {
                span #job-state class="state state-failed" title="completed, but every request item failed" { (shown(state, 40)) }
                " " span #all-items-failed .badge-bad { "every item failed" }
            } @else {
                span #job-state class=(format!("state state-{state}")) { (shown(state, 40)) }
            }
        }
        @if !terminal {
            (action(frame, &format!("/jobs/{}/cancel", encode(id)), "Cancel job", "cancel-job", &cancel_confirmation(job[field::MODEL].as_str().unwrap_or(""))))
        }
        @if terminal && state != "completed" && n_chunks == 0 {
            p.note #not-retryable { "Refused before it ran: nothing of it was stored, so it cannot be retried. Fix the cause (its error below) and enqueue it again under a new id." }
        }
        @if terminal && state != "completed" && n_chunks > 0 {
            (action(frame, &format!("/jobs/{}/retry", encode(id)), "Retry job", "retry-job", "Enqueue a retry of this job? It runs again as a new job, from the request items its ledger kept."))
            @if let Some(retry) = crate::cli::retry::retry_id(id) {
                p.note { "Its retry runs as " a #retry-link href=(link(frame, &format!("/jobs/{}", encode(retry.as_str())))) { (shown(retry.as_str(), 120)) } "." }
            }
        }
        table.summary {
            tr { th { "model" } td { (text(&job[field::MODEL])) } }
            tr { th { "items" } td { (text(&job[field::N_ITEMS])) } }
            tr { th { "chunks" } td { (n_chunks) } }
            tr { th { "accepted" } td { (time(&number(&job[field::ACCEPTED_AT]).into())) } }
            tr { th { "updated" } td { (time(&number(&job[field::UPDATED_AT]).into())) } }
            @if job[field::FINISHED_AT].is_null() {
                tr { th { "deadline" } td { (time(&number(&job[field::DEADLINE_AT]).into())) } }
            } @else {
                tr { th { "finished" } td { (time(&number(&job[field::FINISHED_AT]).into())) } }
            }
            tr { th { "results to" } td { (text(&job[field::REPLY_TO])) } }
            tr { th { "metadata" } td { (metadata(job)) } }
            @if !job[field::POSSIBLE_DUPLICATE_SUBMITS].is_null() {
                tr { th { "resubmits" } td { (text(&job[field::POSSIBLE_DUPLICATE_SUBMITS])) } }
            }
            // A pack (a remote batch batchd filled from many jobs): how many jobs share it.
            @if !job[field::PACK_MEMBERS].is_null() {
                tr { th { "pack of" } td #pack-members { (text(&job[field::PACK_MEMBERS])) " jobs (their items, in order, make this remote batch)" } }
            }
        }
        @if let Some(at_remote) = value["job"]["at_remote"].as_array().filter(|at_remote| !at_remote.is_empty()) {
            h2 { "At the remote API" }
            ul #at-remote {
                @for remote in at_remote {
                    li class=(if remote["older_than_p95"] == true { "late" } else { "" }) {
                        "chunk " (text(&remote["chunk"])) ": at the remote API for "
                        (format_age(Duration::from_secs(remote["age_secs"].as_u64().unwrap_or(0))))
                        "; " span.usual { (shown(remote["text"].as_str().unwrap_or(""), 400)) }
                    }
                }
            }
            p.note { "Usual: how long this model's batches took from their submit to their completion at the remote API over the "
                (batchd_core::turnaround::WINDOW_TEXT) " (bucket bounds), counted by the daemons and written every admin sample." }
        }
        h2 { "Chunks" }
        table #chunks.chunks {
            thead { tr { th { "#" } th { "state" } th { "items" } th { "request id" } th { "remote" } th { "polls" } th { "attempts" } th { "submitted" } th { "last error" } } }
            tbody {
                @for index in 0..n_chunks {
                    tr {
                        td.num { (index) }
                        @let status = &value["chunks"][index as usize];
                        td.chunk-state { (text(&status["state"])) }
                        td { (text(chunk(index, field::CHUNK_ITEMS))) }
                        td.mono { (text(chunk(index, field::CHUNK_REQUEST_ID))) }
                        td.chunk-remote { (text(&status["remote"])) }
                        td.num { (text(chunk(index, field::CHUNK_N_POLLS))) }
                        td.num { (text(chunk(index, field::CHUNK_ATTEMPTS))) }
                        td { (time(&number(chunk(index, field::CHUNK_SUBMITTED_AT)).into())) }
                        td.error { (text(chunk(index, field::CHUNK_LAST_ERROR))) }
                    }
                    @if let Some(wait) = value["chunks"][index as usize]["wait"].as_str() {
                        tr.chunk-wait { td {} td colspan="8" id=(format!("wait-{index}")) { (wait) } }
                    }
                    // A chunk packed with other jobs': the pack that carries it, whose page says how many share it.
                    @if let Some(pack) = chunk(index, field::CHUNK_PACK).as_str().filter(|pack| *pack != batchd_core::ids::PACK_QUEUED) {
                        tr.chunk-pack { td {} td colspan="8" id=(format!("pack-{index}")) {
                            "packed with other jobs in "
                            a href=(link(frame, &format!("/jobs/{}", encode(pack)))) { (shown(pack, 120)) }
                            " (one remote batch)"
                        } }
                    }
                }
            }
        }
        @if !job[field::ERROR].is_null() {
            h2 { "Error" }
            (error_fields(&job[field::ERROR]))
        }
        h2 { "Request items" }
        p { a #items-link href=(link(frame, &format!("/jobs/{}/items", encode(id)))) { "Show the request items" }
            " (read from the ledger one chunk at a time, while it stores them: until the job completes)" }
        h2 { "Timeline" }
        ol #timeline.timeline {
            @for (at, what) in &timeline { li { span.time { (format_utc(*at)) } " " (what) } }
        }
        h2 { "Result" }
        @if result.is_null() {
            p.note #no-result { "Not published yet." }
        } @else if result["trimmed"] == true {
            p.note { "The result entry " (text(&result["entry_id"])) " is no longer in its stream (trimmed)." }
        } @else if result["not_read"] == true {
            table.summary #result {
                tr { th { "entry" } td.mono { (text(&result["entry_id"])) } }
                tr { th { "size" } td #result-size { @if result["bytes"].is_null() { "not recorded (published before batchd recorded result sizes)" } @else { (size(&result["bytes"])) } } }
            }
            p.note #result-not-read {
                @if result["bytes"].is_null() {
                    "This page reads a result entry only when its ledger records its size; "
                } @else {
                    "This page reads a result entry of at most " (size(&result["limit_bytes"])) "; "
                }
                "print it whole with: " code #read-with { (shown(result["read_with"].as_str().unwrap_or("-"), 1_000)) }
            }
        } @else {
            table.summary #result {
                tr { th { "status" } td #result-status { (text(&result["status"])) } }
                tr { th { "entry" } td.mono { (text(&result["entry_id"])) } }
                tr { th { "items failed" } td { (text(&result["items_failed"])) " of " (text(&result["items_total"])) } }
                tr { th { "usage" } td.mono { (text(&result["result"]["usage"])) } }
                @if !result["error"].is_null() {
                    tr { th { "error" } td.error { (text(&result["error"]["code"])) ": " (text(&result["error"]["message"])) } }
                }
            }
            @let first = paging["first_index"].as_u64().unwrap_or(0);
            @let page = paging["page"].as_u64().unwrap_or(0);
            @let pages = paging["pages"].as_u64().unwrap_or(0);
            @if pages > 0 {
                h3 { "Responses " (first) "–" ((first + result["result"]["responses"].as_array().map_or(0, Vec::len) as u64).saturating_sub(1)) " of " (text(&paging["total"])) }
                table #responses.responses {
                    thead { tr { th { "#" } th { "ok" } th { "response or error" } } }
                    tbody {
                        @for (offset, response) in result["result"]["responses"].as_array().into_iter().flatten().enumerate() {
                            tr {
                                td.num { (first + offset as u64) }
                                td { @if response["success"] == true { "yes" } @else { span.error { "no" } } }
                                td.mono { @if response["success"] == true { (text(&response["result"])) } @else { (text(&response["error"])) } }
                            }
                        }
                    }
                }
                p.pager {
                    @if page > 0 { a href=(link(frame, &format!("/jobs/{}?page={}", encode(id), page - 1))) { "← previous" } " " }
                    "page " (page + 1) " of " (pages) " (" (RESPONSES_PAGE) " a page)"
                    @if page + 1 < pages { " " a #next-responses href=(link(frame, &format!("/jobs/{}?page={}", encode(id), page + 1))) { "next →" } }
                }
            }
        }
    };
    layout(frame, &format!("job {}", shown(id, 60)), body)
}

/// An error (a job's, a result's) field by field: `code`, `message`, the provider's code and HTTP status, and any
/// other field it carries; a value that is not an object is its message.
fn error_fields(error: &Value) -> Markup {
    let fields: Vec<(String, &Value)> = match error.as_object() {
        Some(object) => object.iter().map(|(name, value)| (name.clone(), value)).collect(),
        None => vec![("message".to_owned(), error)],
    };
    html! {
        table.summary.error-fields #job-error {
            @for (name, value) in &fields {
                tr data-field=(shown(name, 40)) { th { (shown(name, 40)) } td.error { (text(value)) } }
            }
        }
    }
}

/// A job's metadata as the producer gave it: an object's fields one a row (values as JSON, cut), anything else as
/// JSON; its size when the view left it out.
fn metadata(job: &Value) -> Markup {
    html! {
        @if let Some(bytes) = job["metadata_bytes"].as_u64() {
            span.note { (bytes) " bytes, too large to show here (the JSON twin leaves it out too)" }
        } @else if job[field::METADATA].is_null() {
            "-"
        } @else {
            table.metadata #job-metadata {
                @match job[field::METADATA].as_object() {
                    Some(object) => {
                        @for (name, value) in object.iter().take(50) {
                            tr { th { (shown(name, 80)) } td.mono { (text(value)) } }
                        }
                        @if object.len() > 50 { tr { td colspan="2" { "… " (object.len() - 50) " more (the JSON twin has them)" } } }
                    }
                    None => tr { td.mono { (text(&job[field::METADATA])) } },
                }
            }
        }
    }
}

/// A job's request items: one page of one chunk's, with links to the chunk's other pages and to the other chunks.
pub fn job_items(frame: &Frame<'_>, value: &Value) -> Markup {
    let id = value["job_id"].as_str().unwrap_or("");
    let body = html! {
        h1 { "Request items of job " a #items-job href=(link(frame, &format!("/jobs/{}", encode(id)))) { (shown(id, 120)) } }
        p { span class=(format!("state state-{}", value["state"].as_str().unwrap_or(""))) { (text(&value["state"])) } }
        (request_items(frame, id, &value["requests"]))
    };
    layout(frame, &format!("items of {}", shown(id, 60)), body)
}

/// One page of a chunk's request items, with links to the chunk's other pages and to the other chunks.
fn request_items(frame: &Frame<'_>, id: &str, requests: &Value) -> Markup {
    let chunk = requests["chunk"].as_u64().unwrap_or(0);
    let chunks = requests["chunks"].as_u64().unwrap_or(0);
    let page = requests["page"].as_u64().unwrap_or(0);
    let pages = requests["pages"].as_u64().unwrap_or(0);
    let href = |chunk: u64, page: u64| link(frame, &format!("/jobs/{}/items?chunk={chunk}&page={page}", encode(id)));
    html! {
        @if chunks > 1 {
            p.pager #item-chunks {
                "chunk "
                @for other in 0..chunks.min(100) {
                    @if other == chunk { strong { (other) } } @else { a href=(href(other, 0)) { (other) } }
                    " "
                }
                @if chunks > 100 { "… (" (chunks) " chunks)" }
            }
        }
        @if requests["stored"] != true {
            p.note #no-items { "Not stored any more: a completed job's ledger keeps only its timeline (its responses are below)." }
        } @else if requests["not_read"] == true {
            p.note #items-not-read { "Chunk " (chunk) "'s request items take " (size(&requests["bytes"])) ", more than the "
                (size(&requests["limit_bytes"])) " this page reads; `batchd retry` still rebuilds the job from them." }
        } @else {
            table #items.responses {
                thead { tr { th { "#" } th { "request item" } } }
                tbody {
                    @for item in requests["items"].as_array().into_iter().flatten() {
                        tr { td.num { (text(&item["index"])) } td.mono { (text(&item["item"])) } }
                    }
                }
            }
            p.pager {
                @if page > 0 { a href=(href(chunk, page - 1)) { "← previous" } " " }
                "chunk " (chunk) ": page " (page + 1) " of " (pages) " (" (text(&requests["total"])) " items, " (ITEMS_PAGE) " a page)"
                @if page + 1 < pages { " " a #next-items href=(href(chunk, page + 1)) { "next →" } }
            }
        }
    }
}

/// The failed-jobs page's current filters, to fill the form again.
#[derive(Debug)]
pub struct FailedFilters<'a> {
    /// `failed`, `expired`, `cancelled`, or empty.
    pub state: &'a str,
    /// A model, or empty.
    pub model: &'a str,
    /// An error code, or empty.
    pub code: &'a str,
    /// An age (`1d`) or a time, or empty.
    pub since: &'a str,
}

/// The failed jobs (finished without completing) grouped by error code and model: counts, the newest finished, and
/// the newest examples with their errors, each linking to its job; the filters; the link to the rest of the walk.
pub fn failed(frame: &Frame<'_>, filters: &FailedFilters<'_>, report: &Value) -> Markup {
    let states = ["", "failed", "expired", "cancelled"];
    let groups = report["groups"].as_array().cloned().unwrap_or_default();
    let query = |code: &str, model: &str| {
        format!(
            "state={}&model={}&code={}&since={}",
            encode(filters.state),
            encode(model),
            encode(code),
            encode(filters.since)
        )
    };
    let next = report["next_cursor"]
        .as_u64()
        .map(|cursor| link(frame, &format!("/failed?{}&cursor={cursor}", query(filters.code, filters.model))));
    let body = html! {
        h1 { "Failed jobs" }
        p.note {
            "Jobs that were read, ran (or were refused) and ended without completing: "
            code { "failed" } ", " code { "expired" } ", " code { "cancelled" } ". Each has a ledger and a result entry with its error. "
            "Entries that could not be read as a job at all are the " a href=(link(frame, "/dead")) { "dead letters" } "."
        }
        form #failed-filters.filters method="get" action="/failed" {
            input type="hidden" name="ns" value=(frame.namespace);
            label { "state " select name="state" {
                @for state in states {
                    option value=(state) selected[state == filters.state] { @if state.is_empty() { "any" } @else { (state) } }
                }
            } }
            label { "error code " input type="text" name="code" value=(filters.code) placeholder="retries_exhausted"; }
            label { "model " input type="text" name="model" value=(filters.model) placeholder="@cf/baai/bge-m3"; }
            label { "finished within " input type="text" name="since" value=(filters.since) placeholder="1d" size="5"; }
            button type="submit" { "Filter" }
        }
        p.note #failed-note {
            span #failed-total { (text(&report["total"])) } " failed jobs in " (groups.len()) " groups, from "
            (text(&report["scanned"])) " ledgers read"
            @if next.is_none() { " (every ledger of the namespace)" } @else { " (not every ledger yet: continue below)" }
            "."
        }
        @if !groups.is_empty() {
            p { a #retry-matching href=(link(frame, &format!("/retry?{}", query(filters.code, filters.model)))) {
                "Retry the jobs that match these filters…" } " (a dry run first: nothing is enqueued before you confirm)" }
        }
        table #failed.failed {
            thead { tr { th { "error code" } th { "model" } th { "jobs" } th { "newest finished" } th { "newest examples" } } }
            tbody {
                @for group in &groups {
                    @let code = group["code"].as_str().unwrap_or("");
                    @let model = group["model"].as_str().unwrap_or("");
                    tr.group data-code=(shown(code, 80)) data-model=(shown(model, 80)) {
                        td.error { (shown(code, 80)) }
                        td { (shown(model, 80)) }
                        td.num {
                            a.count href=(link(frame, &format!("/failed?{}", query(code, model)))) { (text(&group["count"])) }
                            br;
                            a.retry-group href=(link(frame, &format!("/retry?{}", query(code, model)))) { "retry…" }
                        }
                        td { (time(&group["newest_finished_at"])) }
                        td {
                            @for example in group["examples"].as_array().into_iter().flatten() {
                                @let id = example["job_id"].as_str().unwrap_or("");
                                div.example {
                                    a.job-link href=(link(frame, &format!("/jobs/{}", encode(id)))) { (shown(id, 120)) }
                                    " " span class=(format!("state state-{}", example["state"].as_str().unwrap_or(""))) { (text(&example["state"])) }
                                    " " span.error { (text(&example["error"]["message"])) }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a #next-walk href=(next) { "Continue the walk →" } }
        }
    };
    layout(frame, "Failed jobs", body)
}

/// A bulk retry's dry run: how many jobs match, what would happen to the newest of them (retried, retried
/// already, not retryable and why), and with actions the confirm form that retries exactly the retryable ones.
pub fn retry_plan(frame: &Frame<'_>, filters: &FailedFilters<'_>, plan: &Value) -> Markup {
    let jobs = plan["jobs"].as_array().cloned().unwrap_or_default();
    let retryable: Vec<&str> =
        jobs.iter().filter(|job| job["outcome"] == "would_retry").filter_map(|job| job["job_id"].as_str()).collect();
    let described = [
        ("state", filters.state),
        ("error code", filters.code),
        ("model", filters.model),
        ("finished within", filters.since),
    ];
    let body = html! {
        h1 { "Retry failed jobs: dry run" }
        p.note {
            "Failed jobs matching "
            @let given: Vec<String> = described.iter().filter(|(_, value)| !value.is_empty()).map(|(name, value)| format!("{name} {}", shown(value, 80))).collect();
            @if given.is_empty() { "any filter" } @else { (given.join(", ")) }
            ": " span #retry-matching-count { (text(&plan["matching"])) } " found in " (text(&plan["scanned"])) " ledgers read"
            @if plan["complete"] != true { " (not every ledger: the walk stopped at its budget)" }
            ". The newest " (jobs.len()) " are checked below; nothing has been enqueued."
        }
        p #retry-summary {
            span #would-retry { (text(&plan["would_retry"])) } " would be retried, "
            span #already-retried { (text(&plan["already_retried"])) } " were retried already, "
            span #not-retryable { (text(&plan["not_retryable"])) } " cannot be retried."
        }
        @if !retryable.is_empty() {
            (action_form(frame, frame.namespace, "/retry", &format!("Retry these {} jobs", retryable.len()), "confirm-retry",
                &format!("Enqueue a retry of each of the {} jobs listed as would be retried?", retryable.len()),
                html! { input type="hidden" name="jobs" value=(retryable.join(",")); }))
        }
        table #retry-plan.jobs {
            thead { tr { th { "job" } th { "retry as" } th { "state" } th { "error code" } th { "finished" } th { "outcome" } } }
            tbody {
                @for job in &jobs {
                    @let id = job["job_id"].as_str().unwrap_or("");
                    tr data-outcome=(job["outcome"].as_str().unwrap_or("")) {
                        td { a.job-link href=(link(frame, &format!("/jobs/{}", encode(id)))) { (shown(id, 120)) } }
                        td.mono { (text(&job["retry_id"])) }
                        td { (text(&job["state"])) }
                        td { (text(&job["code"])) }
                        td { (time(&job["finished_at"])) }
                        td { (text(&job["outcome"])) @if let Some(reason) = job["reason"].as_str() { ": " span.error { (shown(reason, 300)) } } }
                    }
                }
            }
        }
    };
    layout(frame, "Retry failed jobs", body)
}

/// The dead-letter list's current filter, to fill the form again.
#[derive(Debug)]
pub struct DeadFilters<'a> {
    /// Text the error contains, or empty.
    pub error: &'a str,
    /// Dead before (an age or a time), or empty.
    pub before: &'a str,
}

/// The dead-letter stream, newest first, with a filter (error text, age) and, with actions, a purge of exactly the
/// entries the filter matched (the page's list: what the operator saw is what is deleted).
pub fn dead_list(frame: &Frame<'_>, filters: &DeadFilters<'_>, value: &Value) -> Markup {
    let entries = value["entries"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&str> = entries.iter().filter_map(|entry| entry["entry_id"].as_str()).collect();
    let filtered = value["filtered"] == true;
    let body = html! {
        h1 { "Dead letters" }
        p.note {
            "Entries that could not be read as a job (no job field, bad JSON, too large, too many delivery attempts). "
            "Jobs that ran and ended without completing are on the " a href=(link(frame, "/failed")) { "failed jobs" } " page."
        }
        form #dead-filters.filters method="get" action="/dead" {
            input type="hidden" name="ns" value=(frame.namespace);
            label { "error contains " input type="text" name="error" value=(filters.error) placeholder="delivery attempts"; }
            label { "dead before " input type="text" name="before" value=(filters.before) placeholder="1d" size="10"; }
            button type="submit" { "Filter" }
        }
        p.note #dead-note {
            @if filtered {
                span #dead-matching { (entries.len()) } " of the newest " (text(&value["scanned"])) " entries match (" (text(&value["total"])) " in all), newest first."
            } @else {
                (entries.len()) " of " (text(&value["total"])) " entries shown, newest first."
            }
        }
        @if filtered && !ids.is_empty() {
            (action_form(frame, frame.namespace, "/dead/purge", &format!("Purge these {} entries", ids.len()), "purge-matching",
                &format!("Delete the {} dead-letter entries listed, for good?", ids.len()),
                html! { input type="hidden" name="entries" value=(ids.join(",")); }))
        }
        table #dead.dead {
            thead { tr { th { "entry" } th { "dead at" } th { "source" } th { "error" } th { "fields" } @if frame.token.is_some() { th { "actions" } } } }
            tbody {
                @for entry in &entries {
                    @let id = entry["entry_id"].as_str().unwrap_or("");
                    tr id=(format!("dead-{id}")) {
                        td.mono { a href=(link(frame, &format!("/dead/{}", encode(id)))) { (shown(id, 41)) } }
                        td { (time(&entry["dead_at"])) }
                        td.mono { (text(&entry["source_id"])) }
                        td.error { (text(&entry["error"])) }
                        td { @for (name, size) in entry["field_bytes"].as_object().into_iter().flatten().take(8) { span.field { (shown(name, 40)) " (" (text(size)) " B)" } " " } }
                        @if frame.token.is_some() {
                            td.actions {
                                (action(frame, &format!("/dead/{}/retry", encode(id)), "Retry", &format!("retry-{id}"), ""))
                                (action(frame, &format!("/dead/{}/purge", encode(id)), "Purge", &format!("purge-{id}"), "Delete this dead-letter entry for good?"))
                            }
                        }
                    }
                }
            }
        }
    };
    layout(frame, "Dead letters", body)
}

/// One dead-letter entry with its original fields.
pub fn dead_entry(frame: &Frame<'_>, value: &Value) -> Markup {
    let id = value["entry_id"].as_str().unwrap_or("");
    let body = html! {
        h1 { "Dead letter " span.mono { (shown(id, 41)) } }
        (action(frame, &format!("/dead/{}/retry", encode(id)), "Retry", "retry", ""))
        (action(frame, &format!("/dead/{}/purge", encode(id)), "Purge", "purge", "Delete this dead-letter entry for good?"))
        table.summary {
            tr { th { "source entry" } td.mono { (text(&value["source_id"])) } }
            tr { th { "dead at" } td { (time(&value["dead_at"])) } }
            tr { th { "error" } td #dead-error.error { (text(&value["error"])) } }
        }
        h2 { "Original fields" }
        @for (name, field) in value["fields"].as_object().into_iter().flatten() {
            h3.mono { (shown(name, 120)) }
            pre.field { (shown(field.as_str().unwrap_or(""), 20_000)) }
        }
    };
    layout(frame, "Dead letter", body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_size_reads_in_bytes_and_in_its_unit() {
        assert_eq!(size(&json!(0)), "0 bytes");
        assert_eq!(size(&json!(1023)), "1,023 bytes");
        assert_eq!(size(&json!(1536)), "1.5 KiB (1,536 bytes)");
        assert_eq!(size(&json!(79_691_776)), "76.0 MiB (79,691,776 bytes)");
        assert_eq!(size(&json!(null)), "-");
    }

    #[test]
    fn the_jobs_scale_is_a_round_number_at_least_the_peak() {
        let scales: Vec<u64> = [0, 1, 2, 3, 7, 10, 11, 26, 99, 4_999].into_iter().map(round_up).collect();
        assert_eq!(scales, [1, 1, 2, 5, 10, 10, 20, 50, 100, 5_000]);
        assert_eq!(round_up(u64::MAX), u64::MAX, "no overflow, no endless loop");
        assert_eq!(Axis::new(Range::EightDays, 7, 192).y_ticks(), [0, 5, 10]);
        assert_eq!(Axis::new(Range::Hour, 3, 60).y_ticks(), [0, 5], "a half that is not whole is left out");
    }

    #[test]
    fn time_labels_are_utc_hours_or_days() {
        let at = 1_763_799_300_000; // 2025-11-22T08:15:00Z
        assert_eq!(Axis::new(Range::Hour, 1, 60).label(at), "08:15");
        assert_eq!(Axis::new(Range::Day, 1, 24).label(at), "08:15");
        assert_eq!(Axis::new(Range::EightDays, 1, 192).label(at), "11-22");
    }

    #[test]
    fn a_range_is_one_of_three_and_the_hour_by_default() {
        for range in Range::ALL {
            assert_eq!(Range::parse(Some(range.code())), range);
        }
        assert_eq!(Range::parse(Some("7d")), Range::Hour);
        assert_eq!(Range::parse(None), Range::Hour);
        assert_eq!(Range::EightDays.buckets() as u64 * Range::EightDays.bucket_ms(), 8 * 86_400_000);
    }
}
