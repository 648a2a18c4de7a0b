# ctest: the shared libraries loaded into users' processes reference no iostream and no
# std::locale symbol, defined or undefined (src/common/text.h says why: a libstdc++ linked
# statically into libmhccl.so crashed in its first ostringstream insertion beside PyTorch).
#   cmake -DNM=<nm> -DLIBRARY=<file> -P check_no_iostreams.cmake
if(NOT NM OR NOT LIBRARY)
  message(FATAL_ERROR "usage: cmake -DNM=<nm> -DLIBRARY=<shared library> -P check_no_iostreams.cmake")
endif()
execute_process(COMMAND ${NM} -D -C ${LIBRARY} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D -C ${LIBRARY} failed (${rc}): ${err}")
endif()
string(REGEX MATCHALL
  "[^\n]*std::(__cxx11::)?(basic_(ostream|istream|iostream|ios|stringbuf|ostringstream|istringstream|stringstream|ifstream|ofstream|fstream|filebuf)|locale|ios_base|cout|cerr|clog)[^\n]*"
  found "${symbols}")
list(LENGTH found n)
if(n GREATER 0)
  list(SUBLIST found 0 12 shown)
  string(REPLACE ";" "\n  " shown "${shown}")
  message(FATAL_ERROR "${LIBRARY}: ${n} iostream / std::locale symbols (build text with "
          "mhccl::detail::Text, std::to_string or snprintf; read files with stdio), the first:\n  ${shown}")
endif()
string(REGEX MATCHALL "\n" lines "${symbols}")
list(LENGTH lines total)
message(STATUS "${LIBRARY}: no iostream or std::locale symbol among ${total} dynamic symbols")
