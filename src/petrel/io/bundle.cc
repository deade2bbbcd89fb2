#include "petrel/io/bundle.h"

#include "petrel/util/file.h"

#include <algorithm>
#include <set>
#include <tuple>

namespace petrel {

bool is_bundle_path(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path config = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  auto text = read_text_file(config);
  if (!text.ok()) return false;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  return j.is_object() && j.contains("dialog") && j["dialog"].is_object();
}


namespace fs = std::filesystem;

namespace {

std::string ctx_bin_key(size_t i) { return "dialog.engine.model.binary.ctx-bins[" + std::to_string(i) + "]"; }

std::string position_error(const std::string& source, size_t i, const std::string& name, const BundlePart& part,
                           size_t count) {
  return source + ": " + ctx_bin_key(i) + " '" + name + "' holds part " + std::to_string(part.part_index()) + " of " +
         std::to_string(part.part_count()) + " (its header says so), expected part " + std::to_string(i + 1) + " of " +
         std::to_string(count) + " (parts mixed up, or from another export)";
}

bool is_leftover_temp_file(const std::string& name) {
  return name.size() > 1 && name[0] == '.' && name.find(".tmp.") != std::string::npos;
}

}  // namespace

Result<Bundle> Bundle::open(const fs::path& config_json_or_dir, BundleVerify verify, ThreadPool* pool) {
  Bundle bundle;
  PETREL_ASSIGN_OR_RETURN(bundle.config_, load_bundle_config(config_json_or_dir));
  const BundleConfig& c = bundle.config_;
  const std::string source = (c.bundle_dir / kBundleConfigFileName).string();
  const size_t count = c.ctx_bins.size();
  for (size_t i = 0; i < count; ++i) {
    PETREL_ASSIGN_OR_RETURN(BundlePart part, BundlePart::open(c.ctx_bin_path(i), verify, pool));
    if (part.part_index() != static_cast<int>(i) + 1 || part.part_count() != static_cast<int>(count)) {
      return invalid_data(position_error(source, i, c.ctx_bins[i], part, count));
    }
    for (size_t t = 0; t < part.tensors().size(); ++t) {
      const std::string& name = part.tensors()[t].name;
      auto [it, inserted] = bundle.location_.emplace(name, std::pair{i, t});
      if (!inserted) {
        return invalid_data(source + ": tensor '" + name + "' is stored in both " + c.ctx_bins[it->second.first] +
                            " and " + c.ctx_bins[i]);
      }
    }
    bundle.parts_.push_back(std::move(part));
  }
  return bundle;
}

const BundleTensor* Bundle::find(const std::string& name) const {
  auto it = location_.find(name);
  if (it == location_.end()) return nullptr;
  return &parts_[it->second.first].tensors()[it->second.second];
}

Result<const BundleTensor*> Bundle::tensor(const std::string& name) const {
  const BundleTensor* t = find(name);
  if (!t) return not_found(config_.bundle_dir.string() + ": tensor '" + name + "' is in none of the bundle's parts");
  return t;
}

const BundlePart* Bundle::part_of(const std::string& name) const {
  auto it = location_.find(name);
  return it == location_.end() ? nullptr : &parts_[it->second.first];
}

std::vector<std::string> Bundle::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, where] : location_) names.push_back(name);
  return names;
}

const char* checksum_status_name(ChecksumStatus status) {
  switch (status) {
    case ChecksumStatus::kOk: return "ok";
    case ChecksumStatus::kMismatch: return "mismatch";
    case ChecksumStatus::kNotChecked: return "not checked";
  }
  return "?";
}

uint64_t BundleSummary::total_bytes() const {
  uint64_t n = 0;
  for (const BundlePartSummary& p : parts) n += p.file_size;
  return n;
}

size_t BundleSummary::total_tensors() const {
  size_t n = 0;
  for (const BundlePartSummary& p : parts) n += p.tensor_count;
  return n;
}

std::map<std::string, size_t> BundleSummary::total_layouts() const {
  std::map<std::string, size_t> n;
  for (const BundlePartSummary& p : parts) {
    for (const auto& [layout, count] : p.layouts) n[layout] += count;
  }
  return n;
}

Result<BundleSummary> inspect_bundle(const fs::path& config_json_or_dir, BundleVerify verify, ThreadPool* pool) {
  std::error_code ec;
  BundleSummary summary;
  if (fs::is_directory(config_json_or_dir, ec)) {
    summary.dir = config_json_or_dir;
  } else if (fs::exists(config_json_or_dir, ec)) {
    summary.dir = config_json_or_dir.has_parent_path() ? config_json_or_dir.parent_path() : fs::path(".");
  } else {
    return not_found(config_json_or_dir.string() + ": no such bundle directory or config file");
  }
  const std::string source = (summary.dir / kBundleConfigFileName).string();

  Result<BundleConfig> config = load_bundle_config(config_json_or_dir);
  std::vector<std::string> files;  // part files, relative to the directory, in part order
  if (config.ok()) {
    summary.config = *config;
    files = config->ctx_bins;
  } else {
    summary.config_error = config.status().message();
    summary.problems.push_back(summary.config_error);
    // Without a usable config, look at the part files the directory holds, in part order.
    std::vector<std::tuple<int, int, std::string>> found;
    for (const auto& entry : fs::directory_iterator(summary.dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (auto kn = parse_bundle_part_file_name(name)) found.emplace_back(kn->first, kn->second, name);
    }
    std::sort(found.begin(), found.end());
    for (const auto& [k, n, name] : found) files.push_back(name);
  }

  std::map<std::string, std::string> tensor_home;  // name -> part holding it
  for (size_t i = 0; i < files.size(); ++i) {
    BundlePartSummary s;
    s.name = files[i];
    s.path = summary.dir / files[i];
    s.exists = fs::is_regular_file(s.path, ec);
    if (!s.exists) {
      s.error = s.path.string() + ": missing" + (config.ok() ? " (listed as " + ctx_bin_key(i) + ")" : "");
    } else {
      s.file_size = fs::file_size(s.path, ec);
      Result<BundlePart> part = BundlePart::open(s.path, BundleVerify::kHeaderOnly, pool);
      if (!part.ok()) {
        s.error = part.status().message();
      } else {
        s.part_index = part->part_index();
        s.part_count = part->part_count();
        s.tensor_count = part->tensors().size();
        for (const BundleTensor& t : part->tensors()) ++s.layouts[t.layout];
        s.data_bytes = part->data_size();
        if (verify == BundleVerify::kFull) {
          Status data = part->verify_data(pool);
          s.checksum = data.ok() ? ChecksumStatus::kOk : ChecksumStatus::kMismatch;
          if (!data.ok()) s.error = data.message();
        }
        if (config.ok() && s.error.empty() &&
            (s.part_index != static_cast<int>(i) + 1 || s.part_count != static_cast<int>(files.size()))) {
          s.error = position_error(source, i, s.name, *part, files.size());
        }
        for (const BundleTensor& t : part->tensors()) {
          auto [it, inserted] = tensor_home.emplace(t.name, s.name);
          if (!inserted) {
            summary.problems.push_back(source + ": tensor '" + t.name + "' is stored in both " + it->second + " and " +
                                       s.name);
          }
        }
      }
    }
    if (!s.error.empty()) summary.problems.push_back(s.error);
    summary.parts.push_back(std::move(s));
  }

  if (!config.ok()) {
    // Parts found by name: all should agree on N and cover 1..N.
    std::set<int> counts;
    std::set<int> indices;
    for (const BundlePartSummary& s : summary.parts) {
      if (s.part_count > 0) counts.insert(s.part_count);
      if (s.part_index > 0) indices.insert(s.part_index);
    }
    if (counts.size() > 1) {
      summary.problems.push_back(summary.dir.string() + ": the part files disagree on the number of parts (mixed exports?)");
    } else if (counts.size() == 1) {
      for (int k = 1; k <= *counts.begin(); ++k) {
        if (!indices.count(k)) {
          summary.problems.push_back(summary.dir.string() + ": " + bundle_part_file_name(k, *counts.begin()) + " is missing");
        }
      }
    }
  }

  std::set<std::string> listed(files.begin(), files.end());
  std::vector<std::string> extra;
  for (const auto& entry : fs::directory_iterator(summary.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_leftover_temp_file(name)) {
      extra.push_back(entry.path().string() + ": leftover temporary file of an interrupted write (safe to delete)");
    } else if (config.ok() && parse_bundle_part_file_name(name) && !listed.count(name)) {
      extra.push_back(entry.path().string() + ": part file not listed in " + source + " (from another export?)");
    }
  }
  std::sort(extra.begin(), extra.end());
  summary.problems.insert(summary.problems.end(), extra.begin(), extra.end());
  return summary;
}

}  // namespace petrel
