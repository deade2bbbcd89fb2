# Sourced on a GPU machine: puts the directories holding the CUDA libraries petrel links as shared libraries
# (libcublas, libcublasLt, libcusolver and what they need) on LD_LIBRARY_PATH, from the CUDA toolkit or from
# PyTorch's nvidia-* wheels, whichever the machine has.
for lib in libcublas.so.13 libcublasLt.so.13 libcusolver.so.12 libcusparse.so.12 libnvJitLink.so.13; do
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null); do
    if [ -e "$dir/$lib" ]; then
      case ":${LD_LIBRARY_PATH:-}:" in *":$dir:"*) ;; *) LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir" ;; esac
      break
    fi
  done
done
export LD_LIBRARY_PATH
