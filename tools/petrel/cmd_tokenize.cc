// Placeholder: filled in by the text module (issue 3).
#include "commands.h"

namespace petrel::cli {

void add_tokenize_commands(CLI::App& app, CliContext& ctx) { (void)app; (void)ctx; }
}  // namespace petrel::cli
