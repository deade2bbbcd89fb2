#include "petrel/io/npy.h"

#include <cstring>
#include <regex>

#include "petrel/util/file.h"

namespace petrel {

int64_t NpyArray::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Status write_npy_f32(const std::filesystem::path& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += (i ? ", " : "") + std::to_string(shape[i]);
    n *= shape[i];
  }
  if (shape.size() == 1) dict += ",";  // Python's one-element tuple
  dict += "), }";
  // Magic (6) + version (2) + header length (2) + dict, padded with spaces and '\n' to a multiple of 64.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string header = "\x93NUMPY";
  header += '\x01';
  header += '\x00';
  const uint16_t len = static_cast<uint16_t>(dict.size());
  header += static_cast<char>(len & 0xff);
  header += static_cast<char>(len >> 8);
  header += dict;
  PETREL_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(path));
  PETREL_RETURN_IF_ERROR(writer->write(header));
  PETREL_RETURN_IF_ERROR(writer->write(data, static_cast<size_t>(n) * sizeof(float)));
  return writer->commit();
}

Result<NpyArray> read_npy(const std::filesystem::path& path) {
  PETREL_ASSIGN_OR_RETURN(std::string bytes, read_text_file(path));
  const std::string where = path.string();
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return invalid_data(where + ": not a .npy file");
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return invalid_data(where + ": truncated header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[8 + i]);
    offset = 12;
  } else {
    return unsupported(where + ": .npy version " + std::to_string(major));
  }
  if (offset + header_len > bytes.size()) return invalid_data(where + ": header runs past the end of the file");
  const std::string header = bytes.substr(offset, header_len);
  std::smatch m;
  NpyArray array;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'"))) return invalid_data(where + ": no descr");
  array.descr = m[1];
  if (array.descr != "<f4" && array.descr != "<i4") return unsupported(where + ": dtype " + array.descr + " (need <f4 or <i4)");
  if (std::regex_search(header, m, std::regex("'fortran_order':\\s*True"))) return unsupported(where + ": Fortran order");
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) return invalid_data(where + ": no shape");
  std::string dims = m[1];
  std::regex number("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), number); it != std::sregex_iterator(); ++it) {
    array.shape.push_back(std::stoll(it->str()));
  }
  const size_t expected = static_cast<size_t>(array.num_elements()) * 4;
  const size_t data_offset = offset + header_len;
  if (bytes.size() - data_offset != expected) {
    return invalid_data(where + ": " + std::to_string(bytes.size() - data_offset) + " data bytes, shape needs " +
                        std::to_string(expected));
  }
  array.data.assign(bytes.begin() + data_offset, bytes.end());
  return array;
}

}  // namespace petrel
