#include <cstdio>

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

  CLI11_PARSE(app, argc, argv);
  return ctx.exit_code;
}
