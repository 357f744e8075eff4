{
  "targets": [
    {
      "target_name": "lb_native",
      "sources": [
        "native/addon.cc",
        "native/bpf_object.cc",
        "native/bpf_map.cc",
        "native/bpf_link.cc",
        "native/errors.cc",
        "native/netns.cc",
        "native/sock_diag.cc",
        "native/rtnl.cc",
        "native/tc.cc",
        "native/icmp.cc"
      ],
      "include_dirs": [
        "<!@(node -p \"require('node-addon-api').include\")"
      ],
      "defines": [
        "NAPI_VERSION=9",
        "NAPI_CPP_EXCEPTIONS",
        "NODE_ADDON_API_DISABLE_DEPRECATED"
      ],
      "cflags!": ["-fno-exceptions"],
      # Node's common.gypi asks for its own C++ standard (gnu++17 in 20,
      # gnu++20 in 24: V8's headers need it, node-addon-api's do not): the
      # addon stays on the compiler's default, gnu++17 with Debian's g++ 12,
      # as it was built and tested (under gnu++20, g++ 12 -O3 warns
      # -Wrestrict falsely on std::string in native/errors.cc).
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17", "-std=gnu++20"],
      "cflags_cc": ["-std=gnu++17", "-fexceptions", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
      "libraries": ["-lbpf", "-lelf", "-lz"]
    }
  ]
}
