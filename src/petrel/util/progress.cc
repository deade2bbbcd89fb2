#include "petrel/util/progress.h"

#include <unistd.h>

#include <cstdio>

namespace petrel {

std::string format_duration(double seconds) {
  char buf[32];
  const long s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  return buf;
}

ProgressBar::ProgressBar(std::string label, double total, bool enabled)
    : label_(std::move(label)), total_(total > 0 ? total : 1), enabled_(enabled), tty_(::isatty(2) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void ProgressBar::update(double done, const std::string& note) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const double fraction = done / total_ > 1 ? 1 : done / total_;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int decile = static_cast<int>(fraction * 10);
  if (tty_) {
    if (std::chrono::duration<double>(now - last_draw_).count() < 0.1 && fraction < 1) return;
  } else if (decile == last_decile_) {
    return;
  }
  last_draw_ = now;
  last_decile_ = decile;
  constexpr int kWidth = 24;
  std::string bar(kWidth, ' ');
  for (int i = 0; i < static_cast<int>(fraction * kWidth); ++i) bar[i] = '#';
  const std::string eta = fraction > 0 ? format_duration(elapsed / fraction - elapsed) : "?";
  std::fprintf(stderr, "%s%s [%s] %3d%%  %s  %s, ETA %s%s", tty_ ? "\r\033[K" : "", label_.c_str(), bar.c_str(),
               static_cast<int>(fraction * 100), note.c_str(), format_duration(elapsed).c_str(), eta.c_str(),
               tty_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressBar::finish(const std::string& note) {
  if (!enabled_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "%s%s done in %s%s%s\n", tty_ ? "\r\033[K" : "", label_.c_str(), format_duration(elapsed).c_str(),
               note.empty() ? "" : ": ", note.c_str());
}

}  // namespace petrel
