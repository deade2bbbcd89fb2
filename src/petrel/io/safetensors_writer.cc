#include "petrel/io/safetensors_writer.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace petrel {

uint64_t TensorSpec::num_bytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::create(const std::filesystem::path& path,
                                                                     std::vector<TensorSpec> tensors,
                                                                     const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  // nlohmann's ordered_json keeps declaration order in the header, as the data region is laid out.
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    if (header.contains(t.name)) return invalid_argument("safetensors writer: tensor '" + t.name + "' declared twice");
    const uint64_t bytes = t.num_bytes();
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data region 8-byte aligned, as the reference writer does
  PETREL_ASSIGN_OR_RETURN(w->file_, AtomicFileWriter::create(path));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  PETREL_RETURN_IF_ERROR(w->file_->write(len, 8));
  PETREL_RETURN_IF_ERROR(w->file_->write(text));
  w->tensors_ = std::move(tensors);
  w->data_bytes_expected_ = offset;
  return w;
}

Status SafetensorsWriter::write(const void* data, size_t size) {
  if (data_bytes_written_ + size > data_bytes_expected_) {
    return internal_error("safetensors writer: more bytes written than the declared tensors hold");
  }
  PETREL_RETURN_IF_ERROR(file_->write(data, size));
  data_bytes_written_ += size;
  return ok_status();
}

Status SafetensorsWriter::finish() {
  if (data_bytes_written_ != data_bytes_expected_) {
    return internal_error("safetensors writer: " + std::to_string(data_bytes_written_) + " of " +
                          std::to_string(data_bytes_expected_) + " declared bytes written");
  }
  return file_->commit();
}

Result<std::unique_ptr<ShardedSafetensorsWriter>> ShardedSafetensorsWriter::create(const std::filesystem::path& dir,
                                                                                   std::vector<TensorSpec> tensors,
                                                                                   uint64_t max_shard_bytes) {
  std::unique_ptr<ShardedSafetensorsWriter> w(new ShardedSafetensorsWriter());
  w->dir_ = dir;
  w->tensors_ = std::move(tensors);
  w->shards_.emplace_back();
  uint64_t bytes = 0;
  for (size_t i = 0; i < w->tensors_.size(); ++i) {
    const uint64_t n = w->tensors_[i].num_bytes();
    if (!w->shards_.back().empty() && bytes + n > max_shard_bytes) {
      w->shards_.emplace_back();
      bytes = 0;
    }
    w->shards_.back().push_back(i);
    bytes += n;
  }
  for (size_t s = 0; s < w->shards_.size(); ++s) {
    char name[64];
    if (w->shards_.size() == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, w->shards_.size());
    w->shard_names_.push_back(name);
  }
  PETREL_RETURN_IF_ERROR(w->open_shard(0));
  return w;
}

Status ShardedSafetensorsWriter::open_shard(size_t shard) {
  std::vector<TensorSpec> specs;
  for (size_t i : shards_[shard]) specs.push_back(tensors_[i]);
  PETREL_ASSIGN_OR_RETURN(writer_, SafetensorsWriter::create(dir_ / shard_names_[shard], specs, {{"format", "pt"}}));
  current_shard_ = shard;
  written_in_shard_ = 0;
  return ok_status();
}

Status ShardedSafetensorsWriter::write_tensor(const std::string& name, const void* data, size_t size) {
  if (next_tensor_ >= tensors_.size()) return internal_error("sharded writer: tensor '" + name + "' was not declared");
  const TensorSpec& spec = tensors_[next_tensor_];
  if (spec.name != name || spec.num_bytes() != size) {
    return internal_error("sharded writer: expected tensor '" + spec.name + "' (" + std::to_string(spec.num_bytes()) +
                          " bytes) next, got '" + name + "' (" + std::to_string(size) + " bytes)");
  }
  PETREL_RETURN_IF_ERROR(writer_->write(data, size));
  ++next_tensor_;
  if (++written_in_shard_ == shards_[current_shard_].size()) {
    PETREL_RETURN_IF_ERROR(writer_->finish());
    writer_.reset();
    if (current_shard_ + 1 < shards_.size()) PETREL_RETURN_IF_ERROR(open_shard(current_shard_ + 1));
  }
  return ok_status();
}

Status ShardedSafetensorsWriter::finish() {
  if (next_tensor_ != tensors_.size()) {
    return internal_error("sharded writer: " + std::to_string(next_tensor_) + " of " + std::to_string(tensors_.size()) +
                          " tensors written");
  }
  if (shards_.size() == 1) return ok_status();
  nlohmann::ordered_json index;
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t.num_bytes();
  index["metadata"] = {{"total_size", total}};
  nlohmann::ordered_json map;
  for (size_t s = 0; s < shards_.size(); ++s)
    for (size_t i : shards_[s]) map[tensors_[i].name] = shard_names_[s];
  index["weight_map"] = map;
  return write_file_atomic(dir_ / "model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace petrel
