// kernels/cuda: the installed timeline ring (timeline.h). Plain C++, built with or without CUDA.
#include "petrel/kernels/cuda/timeline.h"

namespace petrel::cuda {

namespace {
TimelineRing installed;
bool has_ring = false;
}  // namespace

void set_timeline(const TimelineRing* ring) {
  has_ring = ring != nullptr;
  if (ring) installed = *ring;
}

const TimelineRing* active_timeline() { return has_ring ? &installed : nullptr; }

}  // namespace petrel::cuda
