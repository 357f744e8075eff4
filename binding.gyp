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
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17"],
      "cflags_cc": ["-std=gnu++17", "-fexceptions", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
      "libraries": ["-lbpf", "-lelf", "-lz"]
    }
  ]
}
