#include "commands.h"

namespace petrel::cli {

void add_inspect_command(CLI::App& app, CliContext& ctx) { (void)app; (void)ctx; }

}  // namespace petrel::cli
