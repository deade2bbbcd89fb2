#include "petrel/io/safetensors_writer.h"

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

}  // namespace petrel
