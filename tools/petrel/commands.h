// The petrel CLI: one file per subcommand, each a thin layer over the library.
// A command file defines add_<name>_command(app, ctx), which declares its flags and sets a callback that
// stores the command's exit code in ctx. main.cc lists them all.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "petrel/kernels/cpu/ops.h"
#include "petrel/util/status.h"

namespace petrel::cli {

struct CliContext {
  int exit_code = 0;
};

// Prints "petrel <command>: error: <message>" to stderr and returns the exit code for the status:
// 0 ok, 2 invalid argument / not found, 3 invalid or unsupported data, 4 I/O, 1 anything else.
int report_error(const std::string& command, const Status& status);

// --kv-type f16|q8|f32: the KV cache's element type (f16 by default). kv_type_of maps the checked name.
void add_kv_type_option(CLI::App* cmd, std::string& value);
cpu::KvType kv_type_of(const std::string& name);

// --backend cpu|cuda|auto (default auto: the bundle's dialog.engine.backend.type, cpu for a checkpoint).
// The value is checked by petrel::parse_backend when the command runs.
void add_backend_option(CLI::App* cmd, std::string& value);
// --deterministic: on the cuda backend, decode steps that give the same logits bit for bit on every run
// (CudaModelOptions::decode_atomic_reduce off); no effect on the CPU, which always does.
void add_deterministic_option(CLI::App* cmd, bool& value);

void add_generate_command(CLI::App& app, CliContext& ctx);
void add_logits_command(CLI::App& app, CliContext& ctx);
void add_inspect_command(CLI::App& app, CliContext& ctx);
void add_make_random_command(CLI::App& app, CliContext& ctx);
void add_quantize_command(CLI::App& app, CliContext& ctx);
void add_validate_command(CLI::App& app, CliContext& ctx);
void add_export_command(CLI::App& app, CliContext& ctx);
void add_run_command(CLI::App& app, CliContext& ctx);
void add_bench_command(CLI::App& app, CliContext& ctx);
void add_chat_command(CLI::App& app, CliContext& ctx);
void add_doctor_command(CLI::App& app, CliContext& ctx);
void add_serve_command(CLI::App& app, CliContext& ctx);
void add_eval_command(CLI::App& app, CliContext& ctx);   // eval bfcl (cmd_eval.cc)
void add_tokenize_commands(CLI::App& app, CliContext& ctx);  // tokenize, detokenize (cmd_tokenize.cc)
void add_template_command(CLI::App& app, CliContext& ctx);   // template (cmd_template.cc)

}  // namespace petrel::cli
