// petrel export: a (quantized, validated) checkpoint to a self-contained bundle.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "commands.h"
#include "petrel/io/export.h"
#include "petrel/util/progress.h"

namespace petrel::cli {

namespace {

struct ExportFlags {
  std::string checkpoint, out, backend = "cpu";
  ExportOptions options;
  bool quiet = false;
};

int run_export(ExportFlags f) {
  if (f.backend == "cpu") f.options.backend = BundleBackend::kCpu;
  else if (f.backend == "cuda") f.options.backend = BundleBackend::kCuda;
  else return report_error("export", invalid_argument("--backend must be cpu or cuda, got '" + f.backend + "'"));
  f.options.show_progress = !f.quiet;
  // For tests of interrupted exports: PETREL_TEST_KILL_EXPORT_AFTER_PART=K ends the process abruptly (as a
  // kill would) once part K is written.
  if (const char* kill_after = std::getenv("PETREL_TEST_KILL_EXPORT_AFTER_PART")) {
    const int k = std::atoi(kill_after);
    f.options.on_part_written = [k](int part) {
      if (part == k) ::_exit(137);
    };
  }
  ExportReport report;
  Status s = export_bundle(f.checkpoint, f.out, f.options, &report);
  if (!s.ok()) return report_error("export", s);
  std::fprintf(stderr, "export: %zu parts, %.1f MB in %s:", report.part_bytes.size(), report.total_bytes / 1e6,
               format_duration(report.seconds).c_str());
  for (uint64_t b : report.part_bytes) std::fprintf(stderr, " %.1f", b / 1e6);
  std::fprintf(stderr, " MB\n");
  return 0;
}

}  // namespace

void add_export_command(CLI::App& app, CliContext& ctx) {
  auto f = std::make_shared<ExportFlags>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Export a checkpoint to a bundle: Genie-style config.json, part_K_of_N.bin (64-byte aligned, checksummed),\n"
      "tokenizer, manifest. A quantized checkpoint must have passed `petrel validate` (or pass --force).");
  cmd->add_option("--checkpoint", f->checkpoint, "Checkpoint directory (quantized or float)")->required();
  cmd->add_option("--out", f->out, "Bundle directory to create")->required();
  cmd->add_option("--context-length", f->options.context_length, "Context size of the bundle's dialog")->capture_default_str();
  cmd->add_option("--parts", f->options.parts, "Number of part files (layers split with balanced bytes)")->capture_default_str();
  cmd->add_option("--backend", f->backend, "Target backend, recorded in config.json (dialog.engine.backend.type): cpu or cuda. Same layout for both")->capture_default_str();
  cmd->add_flag("--force", f->options.force, "Export without a passing validation, and replace an existing bundle");
  cmd->add_flag("-q,--quiet", f->quiet, "No progress bar");
  cmd->callback([f, &ctx] { ctx.exit_code = run_export(*f); });
}

}  // namespace petrel::cli
