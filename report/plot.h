// `napkin plot`: charts of training runs' metrics files (runtime/trainer's
// --metrics JSON lines): the loss (train and eval), tokens/s and MFU over
// steps, one chart per quantity, every run a line, as one SVG or HTML file.
// A file is read a line at a time and each quantity kept in a bounded number
// of buckets, so memory and the page stay bounded however long the run.
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

namespace napkin::report {

// A quantity over steps in bounded memory, drawn as the report's memory
// timeline draws a long schedule: the values fall, in the order they come,
// into at most kMaxBuckets buckets of `width` values each; when every bucket
// is full, neighbours merge pairwise and the width doubles. A bucket keeps its
// first, lowest, highest and last point, so a spike stays on the chart
// however long the run. A missing value (JSON null: a loss that was not
// finite) ends its bucket and breaks the line there (after a merge, at the
// end of the merged bucket).
class BucketedSeries {
 public:
  static constexpr size_t kMaxBuckets = 512;

  // (x, y); a non-finite x or y is a missing value.
  void add(double x, double y);
  // Every value added, missing ones included.
  int64_t values() const { return values_; }
  // Whether any value was there to draw.
  bool drawable() const { return !buckets_.empty(); }
  // The points to draw, in order (at most 4 per bucket); a NaN point between
  // two breaks the line.
  void points(std::vector<double>& x, std::vector<double>& y) const;

 private:
  struct Point {
    int64_t index = 0;  // which value it was
    double x = 0, y = 0;
  };
  struct Bucket {
    Point first, low, high, last;
    int64_t values = 0;
    bool gap_after = false;
  };
  void merge_pairs();

  std::vector<Bucket> buckets_;
  int64_t width_ = 1, values_ = 0;
};

// One run's metrics: each quantity over steps.
struct MetricsRun {
  std::string name;  // the file (and the run, when the file holds several), for the legend
  BucketedSeries loss, tokens_per_s, mfu;  // the progress lines
  BucketedSeries eval_loss;                // the eval lines
};

// A metrics file's runs, its lines read one at a time (`path` names them in
// errors and the legend); nullopt with `error` set ("FILE:LINE: what") when a
// line is not a JSON object (or is longer than any record, 1 MiB) or no line
// is a step's record. A trainer appends to its file, so one file may hold
// several runs: each run's first record is {"run": ID, "start_step": N}, and
// a run record that does not continue the one before (another run id, or a
// start before that run's last step: a branch from an older checkpoint)
// starts a new line, named "FILE, run ID" (", from step N" when the id
// repeats). Lines without a step (the run's peak memory) are skipped; a field
// that is null (a value that was not finite, or unknown) is a gap in its
// line; a quantity a run never logged is left out.
std::optional<std::vector<MetricsRun>> parse_metrics(std::istream& in, const std::string& path, std::string& error);

// The charts as one SVG (the charts stacked) or one HTML page (the same
// SVGs, with a title). A quantity no run logged is left out.
std::string plot_svg(const std::vector<MetricsRun>& runs);
std::string plot_html(const std::vector<MetricsRun>& runs);

}  // namespace napkin::report
