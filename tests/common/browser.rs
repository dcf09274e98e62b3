//! A report page in a real browser: Debian's Chromium, headless, loads
//! `report.html` from a file URL and dumps the DOM after the page's script
//! ran. A probe script added to a copy of the page records what only a
//! browser knows (script errors, failed loads, the bounding box of every
//! `<svg>`) and clicks one column heading of a sortable table; the test
//! reads all of it back from the dumped DOM.
//!
//! Chromium is required: without it the check fails, naming the package
//! (`.ci/install-deps` installs it), never skips.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Debian's `chromium` (or another of the browsers blklab looks for), or
/// a failure that says how to install it.
pub(crate) fn chromium() -> PathBuf {
    blklab::report::screenshot::find_browser().unwrap_or_else(|| {
        panic!(
            "the browser test of report.html needs Chromium, and none of {:?} is on PATH: \
             apt-get install chromium (.ci/install-deps installs it)",
            blklab::report::screenshot::BROWSERS
        )
    })
}

/// Records script errors and failed loads from the start of the page.
const HEAD_PROBE: &str = "<script>window.__probeErrors=[];\
addEventListener('error',function(e){__probeErrors.push(String(e.message||\
(e.target&&e.target.outerHTML)||e));},true);</script>";

/// Clicks the heading of column COL of table TABLE, then records errors,
/// tables, the table of contents and every SVG's bounding box on <html>.
const TAIL_PROBE: &str = r#"<script>(function(){
var out={errors:window.__probeErrors,clicked:false};
var t=document.getElementById(TABLE);
if(t){t.tHead.rows[0].cells[COL].click();out.clicked=true;}
out.tables=Array.prototype.map.call(document.querySelectorAll('table'),function(t){
 return {id:t.id,sortable:t.classList.contains('sortable'),
  cols:t.tHead?t.tHead.rows[0].cells.length:0,rows:t.tBodies.length?t.tBodies[0].rows.length:0};});
out.toc=Array.prototype.map.call(document.querySelectorAll('nav#toc a'),function(a){
 var h=a.getAttribute('href');return {href:h,target:h.charAt(0)==='#'&&!!document.getElementById(h.slice(1))};});
out.svgs=Array.prototype.map.call(document.querySelectorAll('svg'),function(s){
 var r=s.getBoundingClientRect();return {w:r.width,h:r.height,label:s.getAttribute('aria-label')};});
document.documentElement.setAttribute('data-probe',encodeURIComponent(JSON.stringify(out)));
}());</script>"#;

/// What the browser made of a page.
pub(crate) struct Loaded {
    /// The DOM after the page's script and the probe ran.
    pub dom: String,
    /// Console messages Chromium logged (errors, CSP violations, …).
    pub console: Vec<String>,
    /// The probe's record.
    pub probe: Value,
}

/// Decode `%XX` escapes (encodeURIComponent's output).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Load a copy of `html` (with the probes; the heading of column `col` of
/// table `table` is clicked) in headless Chromium.
pub(crate) fn load(html: &Path, (table, col): (&str, usize)) -> Loaded {
    let browser = chromium();
    let page = std::fs::read_to_string(html).unwrap();
    let tail = TAIL_PROBE
        .replace("TABLE", &serde_json::to_string(table).unwrap())
        .replace("COL", &col.to_string());
    let probed = page
        .replacen("<head>", &format!("<head>{HEAD_PROBE}"), 1)
        .replacen("</body>", &format!("{tail}</body>"), 1);
    assert_ne!(probed, page, "no <head> or </body> in {}", html.display());
    // Beside the page, so that anything it refers to resolves as it would.
    let copy = html.with_file_name("report.probe.html");
    std::fs::write(&copy, probed).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let mut args = blklab::report::screenshot::headless_args(profile.path());
    args.extend([
        "--enable-logging=stderr".to_string(),
        "--v=0".into(),
        "--window-size=1400,1000".into(),
        "--dump-dom".into(),
        format!("file://{}", std::fs::canonicalize(&copy).unwrap().display()),
    ]);
    let (dom, stderr) = blklab::report::screenshot::run_browser(&browser, &args)
        .unwrap_or_else(|e| panic!("{}: {e}", browser.display()));
    std::fs::remove_file(&copy).unwrap();
    let console: Vec<String> = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    let probe = attribute(&dom, "<html", "data-probe")
        .map(|p| serde_json::from_str(&percent_decode(&p)).unwrap())
        .unwrap_or_else(|| {
            panic!(
                "the probe did not run in {}:\n{stderr}\n{dom}",
                html.display()
            )
        });
    Loaded {
        dom,
        console,
        probe,
    }
}

/// The value of attribute `name` of the first tag starting `tag` in `dom`.
fn attribute(dom: &str, tag: &str, name: &str) -> Option<String> {
    let start = dom.find(tag)?;
    let end = start + dom[start..].find('>')?;
    let t = &dom[start..end];
    let at = t.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = t[at..].find('"')?;
    Some(t[at..at + len].to_string())
}

/// The `data-v` values of column `col` of table `id`'s body, in DOM order
/// (`None` for a cell without one).
pub(crate) fn column(dom: &str, id: &str, col: usize) -> Vec<Option<f64>> {
    let start = dom
        .find(&format!("<table id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id}"));
    let table = &dom[start..start + dom[start..].find("</table>").unwrap()];
    let body = &table[table.find("<tbody>").unwrap()..table.find("</tbody>").unwrap()];
    body.split("<tr")
        .skip(1)
        .map(|row| {
            let cell = row.split("<td").nth(col + 1).expect("cell");
            let tag = &cell[..cell.find('>').unwrap()];
            tag.find("data-v=\"").map(|at| {
                let v = &tag[at + 8..];
                v[..v.find('"').unwrap()].parse().unwrap()
            })
        })
        .collect()
}

/// Every `data-v` value of every table cell in `dom`, sorted.
pub(crate) fn table_values(dom: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for table in dom.split("<table").skip(1) {
        let table = &table[..table.find("</table>").unwrap()];
        for cell in table.split("<td").skip(1) {
            let tag = &cell[..cell.find('>').unwrap()];
            if let Some(at) = tag.find("data-v=\"") {
                let v = &tag[at + 8..];
                out.push(v[..v.find('"').unwrap()].parse::<f64>().unwrap());
            }
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

/// Is `v` among the sorted `values`? Within one part in 10^12: serde_json
/// reads floats fast rather than exactly (its last bit may differ from the
/// page's, which Rust wrote and reads exactly).
pub(crate) fn contains(values: &[f64], v: f64) -> bool {
    let tol = v.abs() * 1e-12;
    let i = values.partition_point(|x| *x < v - tol);
    values.get(i).is_some_and(|x| (x - v).abs() <= tol)
}

/// Every number in a JSON document, with where it is.
pub(crate) fn json_numbers(v: &Value, path: &str, out: &mut Vec<(String, f64)>) {
    match v {
        Value::Number(n) => out.push((path.to_string(), n.as_f64().unwrap())),
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                json_numbers(x, &format!("{path}/{i}"), out);
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                json_numbers(x, &format!("{path}/{k}"), out);
            }
        }
        _ => {}
    }
}

/// A sortable table of `html` and a column of numbers whose values are
/// not in ascending order as written: clicking its heading must reorder
/// the rows. `None` when no table has one.
fn unsorted_column(html: &str) -> Option<(String, usize)> {
    for part in html.split("<table id=\"").skip(1) {
        let id = &part[..part.find('"').unwrap()];
        let tag = &part[..part.find('>').unwrap()];
        if !tag.contains("class=\"sortable\"") {
            continue;
        }
        let head = &part[..part.find("</thead>").unwrap()];
        for col in 0..head.matches("<th ").count() {
            let v = column(html, id, col);
            if v.len() >= 2
                && v.iter().all(Option::is_some)
                && v.windows(2).any(|w| w[0].unwrap() > w[1].unwrap())
            {
                return Some((id.to_string(), col));
            }
        }
    }
    None
}

/// Everything the browser test asserts of one report page: `dir/report.html`
/// loads from a file URL with no console message and no script error, has
/// real tables (every one with a heading row and a body, most sortable), a
/// table of contents whose every link has its target, every `<svg>` with a
/// non-empty bounding box, no reference to anything outside the page,
/// sorting by a column heading reorders that table's rows in the DOM, and
/// every number of `dir/report.json` is in a table cell of the page.
pub(crate) fn check_report_page(dir: &Path) {
    let html_path = dir.join("report.html");
    let html = std::fs::read_to_string(&html_path).unwrap();
    let what = html_path.display().to_string();
    // Nothing fetched: no src= or href= but the page's own anchors.
    for attr in [" src=\"", " href=\""] {
        for part in html.split(attr).skip(1) {
            let v = &part[..part.find('"').unwrap()];
            assert!(v.starts_with('#'), "{what} refers to {v:?} ({attr})");
        }
    }
    let (table, col) =
        unsorted_column(&html).unwrap_or_else(|| panic!("{what}: no sortable column to test"));
    let loaded = load(&html_path, (&table, col));
    assert!(
        loaded.console.is_empty(),
        "{what}: console messages:\n{}",
        loaded.console.join("\n")
    );
    let p = &loaded.probe;
    assert_eq!(p["errors"], serde_json::json!([]), "{what}: script errors");
    assert_eq!(p["clicked"], true, "{what}");
    // Tables.
    let tables = p["tables"].as_array().unwrap();
    assert!(tables.len() >= 5, "{what}: {} tables", tables.len());
    for t in tables {
        assert!(t["cols"].as_u64().unwrap() >= 2, "{what}: {t}");
        assert!(!t["id"].as_str().unwrap().is_empty(), "{what}: {t}");
    }
    let ids: BTreeSet<&str> = tables.iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), tables.len(), "{what}: table ids are unique");
    for must in ["verdict-changes", "run-identity", "failed"] {
        assert!(ids.contains(must), "{what}: no table {must}: {ids:?}");
    }
    assert!(
        tables.iter().filter(|t| t["sortable"] == true).count() >= tables.len() / 2,
        "{what}: most tables sort"
    );
    // The table of contents: every section, every link has its target.
    let toc = p["toc"].as_array().unwrap();
    let hrefs: Vec<&str> = toc.iter().map(|a| a["href"].as_str().unwrap()).collect();
    for must in ["#verdict", "#run", "#metrics", "#rows", "#numbers"] {
        assert!(hrefs.contains(&must), "{what}: {hrefs:?}");
    }
    assert!(
        hrefs.iter().any(|h| h.starts_with("#metric-")),
        "{what}: no metric in the contents: {hrefs:?}"
    );
    assert!(
        hrefs.iter().any(|h| h.starts_with("#row-")),
        "{what}: no row in the contents: {hrefs:?}"
    );
    for a in toc {
        assert_eq!(a["target"], true, "{what}: {a}");
    }
    // Every plot is drawn with a size.
    let svgs = p["svgs"].as_array().unwrap();
    assert!(!svgs.is_empty(), "{what}: no <svg>");
    for s in svgs {
        assert!(
            s["w"].as_f64().unwrap() > 0.0 && s["h"].as_f64().unwrap() > 0.0,
            "{what}: an empty <svg>: {s}"
        );
    }
    // Sorting: the clicked column, ascending in the DOM now, was not as
    // written.
    let before: Vec<f64> = column(&html, &table, col).into_iter().flatten().collect();
    let after: Vec<f64> = column(&loaded.dom, &table, col)
        .into_iter()
        .flatten()
        .collect();
    assert_ne!(
        before, after,
        "{what}: sorting {table} by column {col} changed nothing"
    );
    let mut sorted = before.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(after, sorted, "{what}: {table} by column {col}");
    // Every number of report.json is in a table of the page.
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let mut numbers = Vec::new();
    json_numbers(&json, "", &mut numbers);
    assert!(numbers.len() > 50, "{what}: {} numbers", numbers.len());
    let in_tables = table_values(&loaded.dom);
    let missing: Vec<&(String, f64)> = numbers
        .iter()
        .filter(|(_, v)| !contains(&in_tables, *v))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: {} of {} numbers of report.json are in no table, e.g. {:?}",
        missing.len(),
        numbers.len(),
        &missing[..missing.len().min(10)]
    );
}
