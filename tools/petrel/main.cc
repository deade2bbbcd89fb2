#include <cstdio>
#include <cstring>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "petrel: Llama-3.x checkpoints to validated, fast W4A16 deployments.\n"
      "Run `petrel <command> --help` for the flags of each command."};
  app.set_version_flag("--version", std::string("petrel ") + PETREL_VERSION);
  app.require_subcommand(1);

  petrel::cli::CliContext ctx;
  petrel::cli::add_generate_command(app, ctx);
  petrel::cli::add_logits_command(app, ctx);
  petrel::cli::add_inspect_command(app, ctx);
  petrel::cli::add_make_random_command(app, ctx);
  petrel::cli::add_quantize_command(app, ctx);
  petrel::cli::add_validate_command(app, ctx);
  petrel::cli::add_export_command(app, ctx);
  petrel::cli::add_run_command(app, ctx);
  petrel::cli::add_bench_command(app, ctx);
  petrel::cli::add_chat_command(app, ctx);
  petrel::cli::add_doctor_command(app, ctx);
  petrel::cli::add_serve_command(app, ctx);
  petrel::cli::add_eval_command(app, ctx);
  petrel::cli::add_tokenize_commands(app, ctx);
  petrel::cli::add_template_command(app, ctx);

  // llama.cpp's multi-letter short flag `-np` (serve's slots), which CLI11 cannot declare: read as --parallel.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-np") == 0) argv[i] = const_cast<char*>("--parallel");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; bad arguments exit 2 as every command's own argument errors do (README), not
    // with CLI11's codes (105, 106, ...).
    return app.exit(e) == 0 ? 0 : 2;
  }
  return ctx.exit_code;
}
