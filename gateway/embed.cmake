# Writes a file's bytes as a C string constant: cmake -DIN=… -DOUT=… -DNAME=… -P embed.cmake
# (used for docs/openapi.json, which gw_rest serves verbatim at /v1/openapi.json, and
# gateway/console.js, the account console's script).
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
string(REGEX REPLACE "(([^,]*,){16})" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT}
  "/*  Generated from ${IN} by gateway/embed.cmake: do not edit. */\n"
  "#include <stddef.h>\n"
  "const char ${NAME}[] = {\n${bytes}0};\n"
  "const size_t ${NAME}_size = ${size};\n")
