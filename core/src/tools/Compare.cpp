// Run comparison over metrics.jsonl files.
#include "tools/Compare.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/Manifest.h"
#include "recipe/TomlText.h"
#include "tools/Metrics.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/util/JsonSupport.h"
#include "util/Files.h"

namespace trainer {

namespace {

double deviation(double value, double reference) {
  if (value == reference || (std::isnan(value) && std::isnan(reference))) return 0.0;  // equal, or both skipped
  return std::abs(value - reference) / std::max(std::abs(reference), 1e-30);
}

// One run's records by step, each with the keys compared; anything else is
// an error naming the file and the record.
std::map<int64_t, MetricsRow> records_by_step(const std::string& dir) {
  const std::string file = dir + "/metrics.jsonl";
  if (!std::filesystem::is_regular_file(file)) {
    throw InputError(fmt::format("{}: no metrics file (is {} a run directory?)", file, dir));
  }
  std::string left_out;
  const std::vector<MetricsRow> rows = read_metrics(file, &left_out);
  if (!left_out.empty()) log::warn(left_out);
  if (rows.empty()) throw InputError(fmt::format("{}: no step records", file));
  std::map<int64_t, MetricsRow> by_step;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (const char* key : {"step", "loss", "grad_norm"}) {
      if (rows[i].count(key) == 0) {
        throw InputError(fmt::format("{}: record {} has no numeric '{}'", file, i + 1, key));
      }
    }
    const double step = rows[i].at("step");
    if (!(step >= 1) || step != std::floor(step) || step > 1e15) {
      throw InputError(fmt::format("{}: record {} has step {}; expected a positive integer", file, i + 1, step));
    }
    if (!by_step.emplace(static_cast<int64_t>(step), rows[i]).second) {
      throw InputError(fmt::format("{}: step {} appears twice (record {})", file, static_cast<int64_t>(step), i + 1));
    }
  }
  return by_step;
}

// Every key of a resolved recipe as "section.key" -> its TOML text
// (arrays of tables by index: logger.0.name).
void flatten(const toml::node& node, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (const toml::table* table = node.as_table()) {
    for (const auto& [key, value] : *table) {
      flatten(value, prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str()), out);
    }
  } else if (const toml::array* array = node.as_array(); array && array->is_array_of_tables()) {
    for (size_t i = 0; i < array->size(); ++i) flatten(*array->get(i), prefix + "." + std::to_string(i), out);
  } else {
    std::ostringstream text;
    text << toml::default_formatter{toml::table{{"v", node}}};
    std::string value = text.str();
    value = value.substr(value.find('=') + 2);
    while (!value.empty() && (value.back() == '\n' || value.back() == ' ')) value.pop_back();
    out[prefix] = value;
  }
}

struct KeyDifference {
  std::string key;
  std::vector<std::string> values;  ///< per run; "(absent)" where a run lacks the key
};

// The keys whose values differ between the runs' recipe.toml files; a run
// without one is named in `notes`.
std::vector<KeyDifference> recipe_differences(const std::vector<std::string>& dirs, std::vector<std::string>& notes) {
  std::vector<std::map<std::string, std::string>> recipes;
  for (const std::string& dir : dirs) {
    const std::string file = dir + "/recipe.toml";
    std::map<std::string, std::string> keys;
    if (!std::filesystem::is_regular_file(file)) {
      notes.push_back(fmt::format("{}: no recipe.toml; its keys are not compared", dir));
    } else {
      try {
        flatten(parse_toml_file(file, "recipe"), "", keys);
      } catch (const toml::parse_error& error) {
        notes.push_back(
            fmt::format("{}: not a readable recipe ({}); its keys are not compared", file, error.description()));
      } catch (const InputError& error) {
        notes.push_back(fmt::format("{}; its keys are not compared", error.what()));
      }
    }
    recipes.push_back(std::move(keys));
    // A run resumed under another recipe kept the earlier one (keep_recipe_history).
    std::vector<int64_t> steps;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      if (const auto step = manifest::kept_recipe_step(entry.path().filename().string())) steps.push_back(*step);
    }
    std::sort(steps.begin(), steps.end());
    std::vector<std::string> kept;
    for (const int64_t step : steps) kept.push_back(manifest::kept_recipe_name(step));
    if (!kept.empty()) {
      notes.push_back(
          fmt::format("{}: resumed under another recipe; its earlier steps were trained with {} (only "
                      "recipe.toml's keys are compared)",
                      dir, fmt::join(kept, ", ")));
    }
  }
  std::map<std::string, bool> all;
  for (const auto& r : recipes) {
    for (const auto& [key, value] : r) all[key] = true;
  }
  std::vector<KeyDifference> out;
  for (const auto& [key, unused] : all) {
    KeyDifference d{key, {}};
    for (size_t i = 0; i < recipes.size(); ++i) {
      if (recipes[i].empty()) {
        d.values.push_back("(no recipe)");
        continue;
      }
      const auto it = recipes[i].find(key);
      d.values.push_back(it == recipes[i].end() ? "(absent)" : it->second);
    }
    if (std::any_of(d.values.begin(), d.values.end(), [&](const std::string& v) { return v != d.values[0]; })) {
      out.push_back(std::move(d));
    }
  }
  return out;
}

// The report page: the data as JSON, uPlot (third_party/uplot, embedded at
// build time) drawing it. The page marks <body data-rendered="N"> once its N
// charts exist and collects script errors in data-errors (what the browser
// test reads).
constexpr const char* kReportScript = R"js(
window.onerror = function (message) {
  document.body.dataset.errors = (document.body.dataset.errors || "") + message + "\n";
};
(function () {
  const d = REPORT;
  const colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
  const width = Math.min(1100, window.innerWidth - 40);
  let charts = 0;
  function chart(id, title, series, values, log) {
    const el = document.getElementById(id);
    const opts = {
      title: title, width: width, height: 300,
      scales: { x: { time: false }, y: log ? { distr: 3, log: 10 } : {} },
      axes: [{ label: "step" },
             { size: 80, values: (u, vals) => vals.map(v => v == null ? "" :
                                                       log ? v.toExponential(0) : String(Number(v.toPrecision(4)))) }],
      series: [{ label: "step" }].concat(series),
    };
    new uPlot(opts, [d.steps].concat(values), el);
    charts++;
  }
  function perRun(key) {
    return { series: d.runs.map((r, i) => ({ label: r, stroke: colors[i % colors.length], width: 1.5 })),
             values: d.runs.map((r, i) => d[key][i]) };
  }
  for (const key of ["loss", "grad_norm", "lr"]) {
    const p = perRun(key);
    chart("chart-" + key, key + " (every run)", p.series, p.values, false);
  }
  for (const key of ["loss", "grad_norm"]) {
    const series = [], values = [];
    d.runs.slice(1).forEach((r, i) => {
      series.push({ label: r, stroke: colors[(i + 1) % colors.length], width: 1.5 });
      values.push(d.deviation[key][i].map(v => v === null ? null : Math.max(v, d.floor)));
    });
    series.push({ label: "tolerance " + d.rtol, stroke: "#000", dash: [6, 4], width: 1 });
    values.push(d.steps.map(() => Math.max(d.rtol, d.floor)));
    chart("chart-dev-" + key, "relative deviation of " + key + " from " + d.runs[0] +
          " (log; " + d.floor + " = bit-identical)", series, values, true);
  }
  document.body.dataset.rendered = String(charts);
})();
)js";

std::string escape_html(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

extern const char* const kUplotJs;
extern const char* const kUplotCss;

namespace {

void write_report(const std::string& path, const std::vector<std::string>& dirs,
                  const std::vector<std::map<int64_t, MetricsRow>>& runs, const std::vector<int64_t>& steps,
                  double rtol, const std::vector<KeyDifference>& differences, const std::vector<std::string>& notes,
                  const std::vector<std::string>& beyond, bool agree) {
  Json data;
  data["runs"] = dirs;
  data["steps"] = steps;
  data["rtol"] = rtol;
  data["floor"] = 1e-16;
  for (const char* key : {"loss", "grad_norm", "lr"}) {
    Json per_run = Json::array();
    for (const auto& run : runs) {
      Json values = Json::array();
      for (const int64_t step : steps) {
        const auto it = run.at(step).find(key);
        values.push_back(it == run.at(step).end() || !std::isfinite(it->second) ? Json() : Json(it->second));
      }
      per_run.push_back(values);
    }
    data[key] = per_run;
  }
  for (const char* key : {"loss", "grad_norm"}) {
    Json per_run = Json::array();
    for (size_t r = 1; r < runs.size(); ++r) {
      Json values = Json::array();
      for (const int64_t step : steps) {
        const double d = deviation(runs[r].at(step).at(key), runs[0].at(step).at(key));
        values.push_back(std::isfinite(d) ? Json(d) : Json());
      }
      per_run.push_back(values);
    }
    data["deviation"][key] = per_run;
  }
  std::string page = "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>trainer compare</title>\n<style>";
  page += kUplotCss;
  page +=
      "\nbody{font-family:sans-serif;margin:20px}table{border-collapse:collapse}"
      "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-family:monospace}</style>\n<script>";
  page += kUplotJs;
  page += "</script></head>\n<body>\n<h1>trainer compare</h1>\n<p>";
  page += fmt::format("{} runs, {} common steps, tolerance {:.1e}: <b>{}</b></p>\n<ol>", dirs.size(), steps.size(),
                      rtol, agree ? "all agree" : "DIFFER");
  for (const std::string& dir : dirs) page += "<li>" + escape_html(dir) + "</li>";
  page += "</ol>\n";
  for (const std::string& line : beyond) page += "<p>" + escape_html(line) + "</p>\n";
  for (const std::string& note : notes) page += "<p><i>" + escape_html(note) + "</i></p>\n";
  page += "<h2>Recipe keys that differ</h2>\n";
  if (differences.empty()) {
    page += "<p>none</p>\n";
  } else {
    page += "<table><tr><th>key</th>";
    for (size_t r = 0; r < dirs.size(); ++r) page += fmt::format("<th>run {}</th>", r);
    page += "</tr>\n";
    for (const KeyDifference& d : differences) {
      page += "<tr><td>" + escape_html(d.key) + "</td>";
      for (const std::string& v : d.values) page += "<td>" + escape_html(v) + "</td>";
      page += "</tr>\n";
    }
    page += "</table>\n";
  }
  page += "<h2>Curves</h2>\n";
  for (const char* id : {"chart-loss", "chart-grad_norm", "chart-lr", "chart-dev-loss", "chart-dev-grad_norm"}) {
    page += fmt::format("<div id=\"{}\"></div>\n", id);
  }
  std::string script = kReportScript;
  // </ inside the JSON could end the script element: written as <\/ (JSON reads it the same).
  std::string json = data.dump();
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3)) json.replace(at, 2, "<\\/");
  script.replace(script.find("REPORT"), 6, json);
  page += "<script>" + script + "</script>\n</body></html>\n";
  try {
    write_file_atomically(path, page);
  } catch (const std::exception& error) {
    throw InputError(fmt::format("--html {}: cannot be written ({})", path, error.what()));
  }
}

// --html writes a new file or replaces an earlier report (.html or .htm),
// never anything else: a typo such as `--html run/metrics.jsonl` would
// otherwise replace a compared run's record with the page.
void check_report_path(const std::string& html) {
  namespace fs = std::filesystem;
  check_destination("--html", html, html, {}, "");
  std::error_code error;
  if (fs::exists(fs::symlink_status(html, error))) {
    std::string extension = fs::path(html).extension().string();
    std::transform(extension.begin(), extension.end(), extension.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (extension != ".html" && extension != ".htm") {
      throw InputError(fmt::format(
          "--html {}: the file exists and is not an .html report; expected a new file or an earlier report", html));
    }
  }
}

}  // namespace

int compare_runs(const std::vector<std::string>& run_dirs, double rtol, bool quiet, const std::string& html) {
  if (run_dirs.size() < 2) throw InputError("trainer compare: give at least two run directories");
  if (!html.empty()) check_report_path(html);
  if (!std::isfinite(rtol) || rtol < 0) {
    throw InputError(fmt::format("trainer compare: --rtol must be a finite number >= 0, got {}", rtol));
  }
  std::vector<std::map<int64_t, MetricsRow>> runs;
  for (const std::string& dir : run_dirs) runs.push_back(records_by_step(dir));
  const std::map<int64_t, MetricsRow>& reference = runs.front();
  bool agree = true;
  // Records are matched by their step, never by position.
  std::vector<int64_t> steps;
  for (const auto& [step, row] : reference) {
    bool everywhere = true;
    for (size_t r = 1; r < runs.size(); ++r) everywhere = everywhere && runs[r].count(step) > 0;
    if (everywhere) steps.push_back(step);
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    if (runs[r].size() != reference.size() || runs[r].size() != steps.size()) {
      fmt::print("note: {} has {} steps ({} to {}), {} has {} ({} to {}); {} steps are in every run\n", run_dirs[r],
                 runs[r].size(), runs[r].begin()->first, runs[r].rbegin()->first, run_dirs[0], reference.size(),
                 reference.begin()->first, reference.rbegin()->first, steps.size());
      agree = false;
    }
  }
  if (steps.empty()) throw InputError("trainer compare: the runs have no step in common");
  if (!quiet) {
    fmt::print("{:>6} {:>14}", "step", "loss[0]");
    for (size_t r = 1; r < runs.size(); ++r)
      fmt::print(" {:>11} {:>11}", fmt::format("dloss[{}]", r), fmt::format("dgrad[{}]", r));
    fmt::print("\n");
  }
  double worst = 0.0;
  int64_t worst_step = steps.front();
  size_t worst_run = 1;
  std::string worst_key = "loss";
  for (const int64_t step : steps) {
    const MetricsRow& ref = reference.at(step);
    if (!quiet) fmt::print("{:>6} {:>14.8f}", step, ref.at("loss"));
    for (size_t r = 1; r < runs.size(); ++r) {
      for (const char* key : {"loss", "grad_norm"}) {
        const double d = deviation(runs[r].at(step).at(key), ref.at(key));
        if (!(d <= rtol)) agree = false;
        if (!(d <= worst)) {
          worst = d;
          worst_step = step;
          worst_run = r;
          worst_key = key;
        }
        if (!quiet) fmt::print(" {:>11.3e}", d);
      }
    }
    if (!quiet) fmt::print("\n");
  }
  fmt::print("largest relative deviation: {:.3e} ({} of {} at step {}); tolerance {:.1e}: {}\n", worst, worst_key,
             run_dirs[worst_run], worst_step, rtol, agree ? "all agree" : "DIFFER");
  // The first step where each run leaves the tolerance, per compared key.
  std::vector<std::string> beyond;
  for (size_t r = 1; r < runs.size(); ++r) {
    for (const char* key : {"loss", "grad_norm"}) {
      for (const int64_t step : steps) {
        const double d = deviation(runs[r].at(step).at(key), reference.at(step).at(key));
        if (!(d <= rtol)) {
          beyond.push_back(
              fmt::format("{}: {} first beyond the tolerance at step {} ({:.3e})", run_dirs[r], key, step, d));
          break;
        }
      }
    }
  }
  for (const std::string& line : beyond) fmt::print("{}\n", line);
  std::vector<std::string> notes;
  const std::vector<KeyDifference> differences = recipe_differences(run_dirs, notes);
  for (const std::string& note : notes) fmt::print("note: {}\n", note);
  if (differences.empty()) {
    fmt::print("recipe keys that differ: none\n");
  } else {
    fmt::print("recipe keys that differ:\n");
    for (const KeyDifference& d : differences) fmt::print("  {}: {}\n", d.key, fmt::join(d.values, " | "));
  }
  if (!html.empty()) {
    write_report(html, run_dirs, runs, steps, rtol, differences, notes, beyond, agree);
    fmt::print("report: {}\n", html);
  }
  return agree ? 0 : 1;
}

}  // namespace trainer
