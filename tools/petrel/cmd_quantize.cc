// petrel quantize: a float HF checkpoint to a W4A16 GPTQ-convention checkpoint.
#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "commands.h"
#include "petrel/quant/quantize_checkpoint.h"
#include "petrel/util/parallel.h"
#include "petrel/util/progress.h"

namespace petrel::cli {

namespace {

struct QuantizeFlags {
  std::string checkpoint, out, method = "gptq";
  int bits = 4;
  int64_t group_size = -1;
  bool asym = false;
  bool no_clip_search = false;
  int lm_head_bits = 8;
  int64_t lm_head_group_size = -1;
  int embedding_bits = 16;
  std::vector<std::string> more_bits;
  int64_t embedding_group_size = -1;
  std::vector<std::string> calib;
  double calib_fraction = 0.9;
  int64_t num_samples = 128;
  int64_t calib_seq_len = 256;
  uint64_t seed = 0;
  double damp = 0.01;
  double max_shard_gb = 5.0;
  bool force = false;
  bool quiet = false;
  int threads = 0;
  int64_t max_layers = -1;
  std::string device = "auto";
};

// Debian 12's OpenBLAS (0.3.21) does not know recent Intel cores and falls back to its SSE3 "Prescott"
// kernels, several times slower for GPTQ's Hessians and updates. The kernel is chosen when the library loads,
// so petrel can only say how to pick a better one.
void warn_about_slow_blas() {
  const char* core = openblas_get_corename();
  if (core && std::strcmp(core, "Prescott") == 0 && !std::getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx2")) {
    std::fprintf(stderr,
                 "quantize: note: OpenBLAS picked its generic Prescott kernels on this AVX2/AVX-512 CPU; GPTQ runs "
                 "several times faster with OPENBLAS_CORETYPE=SkylakeX (AVX-512) or Haswell (AVX2) in the environment\n");
  }
}

int run_quantize(const QuantizeFlags& f) {
  ThreadPool::set_global_threads(f.threads);
  quant::QuantizeOptions o;
  if (f.method == "gptq") o.method = quant::QuantMethod::kGptq;
  else if (f.method == "rtn") o.method = quant::QuantMethod::kRtn;
  else return report_error("quantize", invalid_argument("--method must be gptq or rtn, got '" + f.method + "'"));
  if (f.device == "auto") o.device = quant::QuantDevice::kAuto;
  else if (f.device == "cpu") o.device = quant::QuantDevice::kCpu;
  else if (f.device == "cuda") o.device = quant::QuantDevice::kCuda;
  else return report_error("quantize", invalid_argument("--device must be cpu, cuda or auto, got '" + f.device + "'"));
  o.scheme.bits = f.bits;
  o.scheme.group_size = f.group_size;
  o.scheme.symmetric = !f.asym;
  o.scheme.clip_search = !f.no_clip_search;
  if (f.lm_head_bits == 16) {
    o.quantize_lm_head = false;
  } else {
    o.lm_head_scheme.bits = f.lm_head_bits;
    o.lm_head_scheme.group_size = f.lm_head_group_size;
    o.lm_head_scheme.clip_search = !f.no_clip_search;
  }
  o.more_bits_modules = f.more_bits;
  if (f.embedding_bits != 16) {
    o.quantize_embedding = true;
    o.embedding_scheme.bits = f.embedding_bits;
    o.embedding_scheme.group_size = f.embedding_group_size;
    o.embedding_scheme.clip_search = !f.no_clip_search;
  }
  if (f.calib.empty()) o.calibration.files = {PETREL_DEFAULT_CORPUS};
  else o.calibration.files.assign(f.calib.begin(), f.calib.end());
  o.calibration.fraction = f.calib_fraction;
  o.calibration.num_samples = f.num_samples;
  o.calibration.seq_len = f.calib_seq_len;
  o.calibration.seed = f.seed;
  o.gptq.damp_percent = f.damp;
  o.max_shard_bytes = static_cast<uint64_t>(f.max_shard_gb * 1e9);
  o.overwrite = f.force;
  o.show_progress = !f.quiet;
  o.max_layers = f.max_layers;
  if (o.method == quant::QuantMethod::kGptq && o.device == quant::QuantDevice::kCpu) warn_about_slow_blas();
  std::fprintf(stderr, "quantize: %s, %s, LM head %s, embedding %s\n", quant::method_name(o.method),
               o.scheme.to_string().c_str(), o.quantize_lm_head ? o.lm_head_scheme.to_string().c_str() : "unquantized",
               o.quantize_embedding ? (o.embedding_scheme.to_string() + " rtn").c_str() : "unquantized");
  quant::QuantizeReport report;
  Status s = quant::quantize_checkpoint(f.checkpoint, f.out, o, &report);
  if (!s.ok()) return report_error("quantize", s);
  std::fprintf(stderr, "quantize: %lld layers in %s (%.2f s/layer, %s), %lld calibration tokens, %.1f MB written\n",
               static_cast<long long>(report.layers_done), format_duration(report.seconds).c_str(),
               report.seconds_per_layer, o.method == quant::QuantMethod::kGptq ? quant::device_name(report.device) : "cpu",
               static_cast<long long>(report.calibration_tokens), report.output_bytes / 1e6);
  return 0;
}

}  // namespace

void add_quantize_command(CLI::App& app, CliContext& ctx) {
  auto f = std::make_shared<QuantizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Quantize a Hugging Face checkpoint to W4A16 (GPTQ safetensors): 4-bit weights per output channel or per\n"
      "group, RTN or GPTQ with calibration text, LM head 8-bit per channel. Streams layer by layer.");
  cmd->add_option("--checkpoint", f->checkpoint, "Float checkpoint directory (bf16/f16/f32 safetensors)")->required();
  cmd->add_option("--out", f->out, "Output directory (written to a temporary name, renamed when complete)")->required();
  cmd->add_option("--method", f->method, "gptq (calibrated) or rtn (round to nearest)")->capture_default_str();
  cmd->add_option("--bits", f->bits, "Bits of the decoder linear weights (4 or 8)")->capture_default_str();
  cmd->add_option("--group-size", f->group_size, "-1: per output channel (Qualcomm's W4A16); else 32, 64, 128")->capture_default_str();
  cmd->add_flag("--asym", f->asym, "Asymmetric (zero point per group) instead of symmetric");
  cmd->add_flag("--no-clip-search", f->no_clip_search, "Use plain min/max ranges instead of the error-minimising clip search");
  cmd->add_option("--lm-head-bits", f->lm_head_bits, "LM head: 8 or 4 (GPTQ like the layers), or 16 (left unquantized)")
      ->check(CLI::IsMember({4, 8, 16}))
      ->capture_default_str();
  cmd->add_option("--lm-head-group-size", f->lm_head_group_size, "LM head: -1 per output channel, else 32, 64, 128")
      ->capture_default_str();
  cmd->add_option("--more-bits", f->more_bits,
                  "8-bit for these projections (e.g. v_proj,down_proj) in the layers llama.cpp's Q4_K_M gives more "
                  "bits: the first and last eighth and every third between")
      ->delimiter(',');
  cmd->add_option("--embedding-bits", f->embedding_bits,
                  "Embedding table: 16 leaves it in the source dtype; 8 or 4 quantize it (RTN per token row; petrel "
                  "reads the result, vLLM and transformers do not)")
      ->check(CLI::IsMember({4, 8, 16}))
      ->capture_default_str();
  cmd->add_option("--embedding-group-size", f->embedding_group_size,
                  "Embedding table: -1 one scale per token row, else 32, 64, 128 (groups along the hidden size)")
      ->capture_default_str();
  cmd->add_option("--calib", f->calib, "Calibration text files (default: the WikiText-2 corpus shipped in the repo)");
  cmd->add_option("--calib-fraction", f->calib_fraction, "Use only the first fraction of each calibration file")->capture_default_str();
  cmd->add_option("--num-samples", f->num_samples, "Calibration samples")->capture_default_str();
  cmd->add_option("--calib-seq-len", f->calib_seq_len, "Tokens per calibration sample")->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of the calibration sample offsets")->capture_default_str();
  cmd->add_option("--damp", f->damp, "GPTQ damping, as a fraction of the mean Hessian diagonal")->capture_default_str();
  cmd->add_option("--max-shard-gb", f->max_shard_gb, "Largest output shard, in GB")->capture_default_str();
  cmd->add_flag("--force", f->force, "Replace the output directory if it exists");
  cmd->add_flag("-q,--quiet", f->quiet, "No progress bar");
  cmd->add_option("-t,--threads", f->threads, "Worker threads; 0 = all cores")->capture_default_str();
  cmd->add_option("--max-layers", f->max_layers, "Timing runs: quantize only the first N layers, write nothing");
  cmd->add_option("--device", f->device,
                  "Where GPTQ runs: cpu, cuda, or auto (cuda when a GPU is present); RTN always runs on the CPU")
      ->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = run_quantize(*f); });
}

}  // namespace petrel::cli
