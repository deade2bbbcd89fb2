#include "commands.h"

namespace petrel::cli {

void add_generate_command(CLI::App& app, CliContext& ctx) { (void)app; (void)ctx; }

}  // namespace petrel::cli
